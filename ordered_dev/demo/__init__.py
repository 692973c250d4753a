"""The demo (``./run demo``): the product end to end on a local cluster.

``command`` is the entry point (arguments, the cluster, start and stop of everything,
summary and audit); ``scenario`` is the application side, through the sidecars' HTTP API
only; ``processes`` starts and stops the sidecar, Prometheus, CLI and audit processes;
``summary`` holds what was observed, the per-key order check and the printed summary.
"""
