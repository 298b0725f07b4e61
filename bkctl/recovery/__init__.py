"""Repairing replication: checker, replicator, manual recovery and autorecovery (docs/architecture.md)."""
