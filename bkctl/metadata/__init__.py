"""The metadata store (ZooKeeper or embedded SQLite) and BookKeeper's layout on top of it."""
