"""OTA and command actions: from a row in the Delta ``actions`` table to a terminal state on every device."""
