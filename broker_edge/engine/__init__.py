"""The broker without I/O: connections, handlers, routing, sessions, the PUBLISH path, log cursors."""
