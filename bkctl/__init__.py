"""bkctl: run, inspect and repair an Apache BookKeeper-compatible replicated log."""

__version__ = "0.1.0"
