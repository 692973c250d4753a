"""The chaos run: load, partition-count changes and faults, then checks of the guarantee.

Used by ``tests/integration/test_chaos.py`` (one short seeded run) and ``bench/chaos.py``
(a run of N minutes). The pieces:

* ``plan``: the seeded schedule of changes and faults (pure: the same seed gives the
  same schedule);
* ``history``: what the run observed (acknowledged produces, deliveries per group and
  instance, hand-off callbacks and events, changes, faults, lock nodes);
* ``expectations``: from a topic's generation log, which hand-off events each change
  requires and which gated records must come after them (pure);
* ``checks``: the checks over a history and the topics as stored (pure);
* ``runner``: runs the cluster side: sidecar processes, producers, consumer groups,
  the change and fault loops, the drain, and the final reads;
* ``report``: the markdown report.
"""
