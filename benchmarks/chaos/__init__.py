"""The fault-injection checker (docs/reliability.md): a ZooKeeper, bkctl bookie processes, two
autorecovery daemons, writer processes that log every acknowledgement, and a seeded schedule of faults
(kill -9 and restart of bookies, writers and daemons, SIGSTOP of bookies and of ZooKeeper past every
session timeout, recovery opens of ledgers being written). At the end every ledger is recovered and read
back and the history is checked: nothing acknowledged lost, no acknowledgement past a ledger's end, every
byte as written, and the cluster back to full replication within a bound.

    python -m benchmarks.chaos --seed 7 --duration 300     # one run; prints its summary as JSON
"""
