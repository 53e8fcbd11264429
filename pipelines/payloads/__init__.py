"""Telemetry payloads in the formats fleets send: JSON, CBOR, Protobuf and Sparkplug B.

Pure functions over payload bytes and Arrow arrays, with no Spark in them: the telemetry job runs them on the
executors (docs/payload-formats.md), and the tests and benches call them directly. A payload that cannot be
read becomes an error naming the field or the byte offset where it broke, never an exception.
"""
