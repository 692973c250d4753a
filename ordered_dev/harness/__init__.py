"""Sidecars, REST consumers and checkers driven from outside, for the tests and the
benchmarks alike: in-process and subprocess sidecars (``sidecars``), REST consumer
instances and callback apps (``consumers``), the ledger of what was acknowledged and
delivered (``ledger``), polling with a bound (``waiting``), and the chaos harness
(``chaos``). The benchmarks import these, never the tests."""
