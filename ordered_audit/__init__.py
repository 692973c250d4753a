"""The offline ordering audit: a PySpark job over the audit topic (the ``audit`` extra).

Apart from the runtime package: the sidecar only emits audit events
(``sidecar.audit.emitter``, ``sidecar.audit.events``); this package reads them back,
checks them and reports. ``sidecar audit`` imports it lazily.
"""
