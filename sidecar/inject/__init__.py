"""Kubernetes sidecar injection: a mutating admission webhook.

``patch.py`` is pure (a pod in, JSON Patch operations out); ``server.py`` is the thin
aiohttp server that answers AdmissionReview v1 requests with those operations, and the
``sidecar inject-webhook`` command that runs it.
"""
