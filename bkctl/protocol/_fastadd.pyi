# The C module bkctl/protocol/_fastadd.c: wire_v3.v3_add_reference in one call (see there).

def v3_add(
    buffer: bytes | bytearray, start: int, end: int, /
) -> tuple[int, int, bytes, int, int, bool, bytes] | None: ...
