"""Timestone as a Sparkplug B host application: the STATE edge nodes wait for, and rebirth requests.

``host`` is the MQTT side of it (``timestone sparkplug-host``); the readings themselves reach Delta through
the brokers' logs and the telemetry job, not through this client (docs/payload-formats.md).
"""
