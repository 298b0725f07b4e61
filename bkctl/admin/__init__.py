"""The admin HTTP plumbing and the autorecovery endpoints: served by the bookie and by the daemon."""
