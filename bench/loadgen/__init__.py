"""The load generator: pre-encoded frames written by asyncio Protocols in worker processes."""
