"""The optional C part of bkctl (everything else is in pyproject.toml).

`bkctl/protocol/_fastadd.c` is the bookie's v3 add fast path. `optional=True`: where it cannot be
compiled (no C compiler or no Python headers) bkctl installs without it and `wire_v3` uses the Python
definitions it mirrors.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("bkctl.protocol._fastadd", ["bkctl/protocol/_fastadd.c"], optional=True)])
