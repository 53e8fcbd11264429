"""The only place that wires things: the Broker, its process, transports, admin HTTP, session store."""
