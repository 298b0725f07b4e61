"""Compaction's scan of an old entry log in a child process, so that its per-record Python work does not
take the bookie's GIL from the reactor thread (a concurrent writer's add latency).

The child (`python -m bkctl.server.gc_scan`) reads one JSON request per line on stdin (log id, path,
index files, batch size) and answers with frames on stdout: each batch of live records (their columns,
and where they are in the old log), then an end or error frame. The bookie reads a batch's records from
the old log itself, straight into the buffer its checkpoint writes from: no record crosses the pipe. The
child holds nothing but read-only file descriptors and exits when stdin closes (the bookie stopped or
was killed). `ScanChild` is the bookie's side; `LiveRecords` (live_records.py) does the scan.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from array import array
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from bkctl.errors import BkctlError
from bkctl.server.fileio import CLOEXEC, read_into
from bkctl.server.moves import Moved
from bkctl.server.storage_kind import DB, INTERLEAVED

if TYPE_CHECKING:
    from bkctl.server.live_records import Slots

log = logging.getLogger("bkctl.bookie")

# kind, bytes of an error message, records, records scanned so far, ledger runs (Moved.runs), spans
_FRAME: Final = struct.Struct(">iqqqqq")
_BATCH, _END, _ERROR = 1, 2, 3
# The scan is background work: at nice 10 (a tenth of the bookie's CPU weight) the bookie's reactor and
# journal threads preempt it as soon as they wake, so a concurrent writer's tail stays short; unlike
# SCHED_IDLE it still gets its share on a busy machine and cannot starve.
SCAN_NICE: Final = 10


class ScanChild:
    """The bookie's side: one child process for every log a GC run compacts (started on first use)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self.scanned = 0
        self.error: str | None = None
        self._open = False
        self._log_fd = -1  # the old log, which the batches' records are read from

    def start(
        self, log_id: int, path: Path, index_paths: dict[int, Path], batch: int, engine: str = INTERLEAVED
    ) -> None:
        """Ask for one log's live records (blocking: call from a pool thread). `index_paths` are what the
        storage's index `find`s: index files, or the db engine's ledgers db (its locations db beside)."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "bkctl.server.gc_scan"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},  # numpy's BLAS threads: never used here
            )
        request = {
            "log_id": log_id,
            "path": str(path),
            "index": {str(k): str(v) for k, v in index_paths.items()},
            "engine": engine,
            "batch_bytes": batch,
        }
        self._close_log()
        self._log_fd = os.open(path, os.O_RDONLY | CLOEXEC)
        # The child has just read these pages: no read-ahead if they were dropped since (see gc.py).
        os.posix_fadvise(self._log_fd, 0, 0, os.POSIX_FADV_RANDOM)
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request).encode() + b"\n")
        self._proc.stdin.flush()
        self.scanned, self.error, self._open = 0, None, True

    def next_batch(self) -> Moved | None:
        """The next batch (blocking); None at the end of the log, with `error` set if it stopped on
        corrupt data; OSError when the child died."""
        if not self._open:
            return None
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        kind, size, count, self.scanned, runs, spans = _FRAME.unpack(_read(stream, bytearray(_FRAME.size)))
        message = _read(stream, bytearray(size))
        columns = _read(stream, bytearray(8 * (4 * count + 4 * runs + 2 * spans)))
        if kind == _BATCH:
            batch = _decode(columns, count, runs, spans)
            batch.records = _read_spans(self._log_fd, batch.spans or [])
            batch.spans = None
            return batch
        self._open = False
        self._close_log()
        if kind == _ERROR:
            self.error = message.decode(errors="replace")
        return None

    def close(self) -> None:
        """Kill the child: after a compaction that stopped half-way its answers are out of step."""
        proc, self._proc = self._proc, None
        self._open = False
        self._close_log()
        if proc is not None:
            proc.kill()
            proc.wait(5)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()

    def _close_log(self) -> None:
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1


def _read_spans(fd: int, spans: list[tuple[int, int]]) -> bytearray:
    """The records of a batch, read back to back from the old log (the reads release the GIL)."""
    records = bytearray(sum(length for _, length in spans))
    with memoryview(records) as view:
        at = 0
        for offset, length in spans:
            if read_into(fd, view[at : at + length], offset) < length:
                raise OSError(f"the old entry log ends before offset {offset + length}")
            at += length
    return records


def _read(stream: IO[bytes], buffer: bytearray) -> bytearray:
    """Fill `buffer` from the child's output (the reads release the GIL)."""
    with memoryview(buffer) as view:
        done = 0
        while done < len(buffer):
            got = stream.readinto(view[done:])  # type: ignore[attr-defined]
            if not got:
                raise OSError("the compaction scan process ended")
            done += got
    return buffer


def _encode(kind: int, batch: Moved, scanned: int) -> list[bytes]:
    """A batch frame: the columns grouped by ledger (the bookie then writes the batch without a loop per
    entry) and the records' spans."""
    assert batch.runs is not None and batch.spans is not None
    header = _FRAME.pack(kind, 0, len(batch), scanned, len(batch.runs), len(batch.spans))
    parts = [header]
    parts += [column.tobytes() for column in (batch.starts, batch.ledgers, batch.entries, batch.old)]
    parts.append(array("q", [value for run in batch.runs for value in run]).tobytes())
    parts.append(array("q", [value for span in batch.spans for value in span]).tobytes())
    return parts


def _decode(columns: bytearray, count: int, runs: int, spans: int) -> Moved:
    batch = Moved()
    at = 0
    with memoryview(columns) as view:
        for column in (batch.starts, batch.ledgers, batch.entries, batch.old):
            column.frombytes(view[at : at + 8 * count])
            at += 8 * count
        flat = array("q", view[at : at + 8 * 4 * runs].tobytes())
        at += 8 * 4 * runs
        places = array("q", view[at : at + 8 * 2 * spans].tobytes())
    batch.runs = [(flat[i], flat[i + 1], flat[i + 2], flat[i + 3]) for i in range(0, len(flat), 4)]
    batch.spans = [(places[i], places[i + 1]) for i in range(0, len(places), 2)]
    return batch


def _answer(out: IO[bytes], request: dict[str, Any]) -> None:
    from bkctl.server.live_records import LiveRecords  # numpy: the child's only

    slots: Slots | None = None
    try:
        slots = _slots(request)
        records = LiveRecords(int(request["log_id"]), Path(request["path"]), slots)
    except (OSError, BkctlError) as exc:
        if slots is not None:
            slots.close()  # this process serves the next logs: no database left open
        message = f"{request['path']}: {exc}".encode()
        out.write(_FRAME.pack(_ERROR, len(message), 0, 0, 0, 0) + message)
        out.flush()
        return
    try:
        while (batch := records.next_batch(int(request["batch_bytes"]))) is not None:
            out.writelines(_encode(_BATCH, batch, records.scanned))
    except (OSError, BkctlError) as exc:
        records.error = f"{request['path']}: {exc}"
    finally:
        records.close()
    if records.error is not None:
        message = records.error.encode()
        out.write(_FRAME.pack(_ERROR, len(message), 0, records.scanned, 0, 0) + message)
    else:
        out.write(_FRAME.pack(_END, 0, 0, records.scanned, 0, 0))
    out.flush()


def _slots(request: dict[str, Any]) -> Slots:
    from bkctl.server.db_slots import DbSlots  # numpy, RocksDB: the child's only
    from bkctl.server.live_records import IndexFileSlots

    paths = {int(k): Path(v) for k, v in request["index"].items()}
    return DbSlots(paths) if request.get("engine") == DB else IndexFileSlots(paths)


def main() -> None:
    """The child: one request per stdin line until stdin closes."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        _answer(out, json.loads(line))


if __name__ == "__main__":
    os.environ.pop("BKCTL_FAULT_POINT", None)  # fault points are the bookie's
    os.nice(SCAN_NICE)
    main()
