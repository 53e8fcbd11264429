"""Reads of logs this broker holds no copy of: observed partitions, remote backlogs and replay starts."""
