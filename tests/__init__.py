"""Timestone test suite (a regular package, so it wins over any installed top-level ``tests``)."""
