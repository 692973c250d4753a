"""Benchmarks of the sidecar against a direct aiokafka client, measured in the same run."""
