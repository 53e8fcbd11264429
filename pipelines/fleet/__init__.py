"""Simulated device fleets: a lean asyncio MQTT 5 client and devices that report and apply actions."""
