"""The `sidecar` commands, one module per command."""
