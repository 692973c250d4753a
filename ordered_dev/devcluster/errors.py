"""Errors of the local development cluster."""

from __future__ import annotations


class DevClusterError(Exception):
    """The local cluster could not be installed, started or stopped."""
