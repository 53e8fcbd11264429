"""The HTTP offsets API of an edge broker: ``server`` (aiohttp, over a ``LogStore``), ``client`` (blocking).

Nothing is loaded here: a Spark executor importing the client never pays for the server (or aiohttp).
"""
