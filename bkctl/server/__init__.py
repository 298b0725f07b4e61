"""The bookie: ledger storage (journal, entry logs, index files) and, on top of it, the network service."""
