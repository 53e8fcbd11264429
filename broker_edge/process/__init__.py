"""The process a broker runs in: the garbage collector's tuning and the C heap's trimming."""
