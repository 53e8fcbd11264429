"""What a broker tells about itself: metrics, counters, logs, path traces, $SYS topics."""
