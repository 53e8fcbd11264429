"""Test harnesses the tests and benchmarks share (a loopback cluster, throwaway certificates): not part of the
product, not installed with it."""
