"""Every bound bkctl enforces, in one place.

Decoders check a length against these before they read or allocate, so a corrupt length field can
never make bkctl allocate gigabytes or loop forever.
"""

from __future__ import annotations

from typing import Final

# Wire protocol: BookKeeper's nettyMaxFrameSizeBytes default.
FRAME_SIZE_MAX: Final = 5 * 1024 * 1024
# An entry must fit in a frame together with the add request header and master key.
ENTRY_SIZE_MAX: Final = FRAME_SIZE_MAX - 1024
MASTER_KEY_SIZE: Final = 20
MASTER_KEY_SIZE_MAX: Final = 1024
# Explicit LAC bodies are 16 bytes + a digest (20 bytes at most for HMAC-SHA1).
EXPLICIT_LAC_SIZE_MAX: Final = 1024

# Ledger shape.
ENSEMBLE_SIZE_MAX: Final = 256
SEGMENTS_MAX: Final = 100_000
CUSTOM_METADATA_MAX: Final = 1024
LEDGER_METADATA_SIZE_MAX: Final = 16 * 1024 * 1024
PASSWORD_SIZE_MAX: Final = 1024

# On-disk files.
JOURNAL_RECORD_SIZE_MAX: Final = FRAME_SIZE_MAX
ENTRYLOG_RECORD_SIZE_MAX: Final = FRAME_SIZE_MAX
ENTRYLOG_LEDGERS_MAP_BATCH_MAX: Final = 10_000
# Read files in chunks of this size: inspect never reads a whole file into memory.
FILE_READ_CHUNK: Final = 4 * 1024 * 1024

# Protobuf (metadata values, v3 frames): nesting and field counts are bounded too.
PROTOBUF_DEPTH_MAX: Final = 16
PROTOBUF_FIELDS_MAX: Final = 1_000_000
