"""Sets of entry ids as bitmaps: how the audit moves what a bookie holds of a ledger (one row per run of
nearby entries instead of one per entry) and compares it with what the metadata gives that bookie.

A packed bitmap is `np.packbits(mask, bitorder="little")`: bit i of the bytes is entry `first + i`.
No pyspark here (numpy only): the readers in executors build them, `compare.py` reads them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

Mask = npt.NDArray[np.bool_]
Ids = npt.NDArray[np.int64]

# A piece of a bookie's ledger starts a new row after a gap this wide or once it spans this many ids:
# rows stay small (<= 512 KiB of bitmap) even for a huge ledger or a far-off stray entry id.
GAP_MAX = 1 << 16  # local bound
SPAN_MAX = 1 << 22  # local bound


def pack(mask: Mask) -> bytes:
    return np.packbits(mask, bitorder="little").tobytes()


def unpack(data: bytes, size: int) -> Mask:
    """The first `size` bits of packed bytes (bits past the bytes are False)."""
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little").view(np.bool_)
    if len(bits) >= size:
        return bits[:size]
    return np.concatenate((bits, np.zeros(size - len(bits), dtype=np.bool_)))


def pieces(ids: Ids) -> Iterator[tuple[int, int]]:
    """(start, stop) slices of sorted, distinct `ids`, cut at wide gaps and at SPAN_MAX ids."""
    if len(ids) == 0:
        return
    cuts = np.flatnonzero(np.diff(ids) > GAP_MAX) + 1
    bounds = [0, *cuts.tolist(), len(ids)]
    for start, stop in itertools.pairwise(bounds):
        while start < stop:
            # the last index whose id is within SPAN_MAX of the piece's first id
            end = start + int(np.searchsorted(ids[start:stop], ids[start] + SPAN_MAX))
            yield start, end
            start = end


def mask_of(ids: Ids, first: int, size: int) -> Mask:
    """A mask of `size` entries from `first` with `ids` (all within) set."""
    mask = np.zeros(size, dtype=np.bool_)
    mask[ids - first] = True
    return mask


def runs(mask: Mask) -> list[tuple[int, int]]:
    """(first, last) index of every run of True in `mask`."""
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return list(zip(edges[0::2].tolist(), (edges[1::2] - 1).tolist(), strict=True))


def striped(first: int, last: int, ensemble_size: int, residues: list[int], size: int) -> Mask:
    """Entries first..last whose id modulo `ensemble_size` is in `residues`, in a mask of `size` from 0:
    with striping, the entries of a segment one bookie of its ensemble gets."""
    table = np.zeros(ensemble_size, dtype=np.bool_)
    table[residues] = True
    mask = np.zeros(size, dtype=np.bool_)
    mask[first : last + 1] = table[np.arange(first, last + 1) % ensemble_size]
    return mask
