"""Typer command groups: thin layers that parse, call the library and render with output.py."""
