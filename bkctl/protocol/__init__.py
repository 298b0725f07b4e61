"""Pure, sans-I/O codecs for Apache BookKeeper's formats: bytes in, values out, nothing else."""
