"""Development and test tooling: the local Kafka + ZooKeeper cluster (Maven installs,
processes, containers, the test provider) and the product demo. Not part of the
runtime package: the sidecar image carries only ``sidecar``."""
