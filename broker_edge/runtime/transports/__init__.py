"""Transports: how bytes reach a ``Connection`` (TCP and TLS sockets, WebSocket messages)."""
