"""Ordering audit: events the sidecars emit, and the PySpark job that checks them."""
