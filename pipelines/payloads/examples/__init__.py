"""Example payload schemas: the Protobuf message the simulated fleet sends (``telemetry.proto``, compiled to
``telemetry.desc``), which ``conf/pipeline.yaml``'s commented Protobuf example reads."""
