"""The telemetry pipeline: broker commitlogs → bronze → silver (parsed, deduplicated, validated) → gold.

``config`` holds the configuration schema, ``transforms`` the DataFrame steps, ``dedup`` the duplicate flags
kept in Spark's state store, ``quality`` the Great Expectations suites, ``job`` the streaming query wiring
(``run`` is what ``timestone pipeline telemetry`` calls). See docs/telemetry-pipeline.md.
"""
