"""ZooKeeper's multiRead request (opcode 22, ZooKeeper 3.6+): many getData reads in one round trip.

kazoo has no API for it, but it sends any object with a `type`, `serialize()` and
`deserialize(buffer, offset)` (its own request classes are such objects); `MultiRead` is one.
The jute records (ZooKeeper's MultiOperationRecord and MultiResponse): every op is a MultiHeader
(type int, done bool, err int) followed by the op's record, and a header with done set ends the list.
A getData op is (path string, watch bool); its answer is a getData header then (data buffer, Stat),
or, when that one read failed, an error header (type -1) then the error code (int). Each read
succeeds or fails on its own: a missing node fails only its own read.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from bkctl.errors import ProtocolError
from bkctl.metadata.store import Stat

MULTI_READ = 22
GET_DATA = 4
ERROR = -1
HEADER = struct.Struct("!iBi")  # type, done, err
INT = struct.Struct("!i")
# czxid, mzxid, ctime, mtime, version, cversion, aversion, ephemeralOwner, dataLength, numChildren, pzxid
STAT = struct.Struct("!qqqqiiiqiiq")
END = HEADER.pack(-1, 1, -1)

# One read's answer: the node's data and Stat, or ZooKeeper's error code for that read.
Answer = tuple[bytes, Stat] | int


class MultiReadError(ProtocolError):
    """A multiRead response that does not match its request (truncated, unknown op, wrong count)."""


def _unpack(fmt: struct.Struct, buffer: bytes, offset: int) -> tuple[int, ...]:
    if len(buffer) - offset < fmt.size:
        raise MultiReadError(f"multiRead response truncated at byte {offset}")
    return fmt.unpack_from(buffer, offset)


def _stat(fields: tuple[int, ...]) -> Stat:
    czxid, mzxid, ctime, mtime, version, cversion, _, owner, length, children, _ = fields
    return Stat(version, cversion, ctime, mtime, owner, length, children, czxid, mzxid)


class MultiRead:
    """A kazoo request reading `paths` (absolute, chroot included) in one round trip, without watches."""

    type = MULTI_READ

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)

    def __repr__(self) -> str:  # kazoo logs requests at debug level: not every path
        return f"MultiRead({len(self.paths)} paths)"

    def serialize(self) -> bytes:
        parts = []
        for path in self.paths:
            raw = path.encode()
            parts.append(HEADER.pack(GET_DATA, 0, -1) + INT.pack(len(raw)) + raw + b"\x00")
        return b"".join(parts) + END

    def deserialize(self, buffer: bytes, offset: int) -> list[Answer]:
        answers: list[Answer] = []
        for _ in range(len(self.paths) + 1):
            kind, done, _ = _unpack(HEADER, buffer, offset)
            offset += HEADER.size
            if done:
                break
            if kind == GET_DATA:
                node, offset = self._node(buffer, offset)
                answers.append(node)
            elif kind == ERROR:
                answers.append(_unpack(INT, buffer, offset)[0])
                offset += INT.size
            else:
                raise MultiReadError(f"op type {kind} in a multiRead response")
        if len(answers) != len(self.paths) or not done:
            raise MultiReadError(f"{len(answers)} answers to a multiRead of {len(self.paths)} paths")
        return answers

    @staticmethod
    def _node(buffer: bytes, offset: int) -> tuple[tuple[bytes, Stat], int]:
        length = max(_unpack(INT, buffer, offset)[0], 0)  # -1: null data
        offset += INT.size
        if len(buffer) - offset < length:
            raise MultiReadError(f"multiRead response truncated in {length} bytes of data")
        data = bytes(buffer[offset : offset + length])
        offset += length
        stat = _stat(_unpack(STAT, buffer, offset))
        return (data, stat), offset + STAT.size
