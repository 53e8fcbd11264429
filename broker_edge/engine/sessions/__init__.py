"""Sessions: what survives a client's connection, and persistent sessions as plain data."""
