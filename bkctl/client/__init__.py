"""The ledger client on Twisted: bookie connections, placement, ledger handles (see docs/client.md)."""
