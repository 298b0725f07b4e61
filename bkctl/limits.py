"""Every bound bkctl enforces, in one place.

Decoders check a length against these before they read or allocate, so a corrupt length field can
never make bkctl allocate gigabytes or loop forever.
"""

from __future__ import annotations

import os
from typing import Final

# Wire protocol: BookKeeper's nettyMaxFrameSizeBytes default.
FRAME_SIZE_MAX: Final = 5 * 1024 * 1024
# Buffers per pwritev/sendmsg call (the kernel's IOV_MAX; 1024 on Linux).
IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
# A payload must fit in a frame together with the add request header, master key, entry header and
# digest; the 1024 bytes spare cover them all (and v3's larger headers).
ENTRY_SIZE_MAX: Final = FRAME_SIZE_MAX - 1024
# What a bookie accepts: a packaged entry (header + digest + payload) of any payload up to
# ENTRY_SIZE_MAX, whatever its digest, and what fits in a read response frame.
PACKAGED_ENTRY_SIZE_MAX: Final = FRAME_SIZE_MAX - 512
MASTER_KEY_SIZE: Final = 20
MASTER_KEY_SIZE_MAX: Final = 1024
# The largest entry id a bookie takes: an index file holds 8 bytes per entry id at its offset, so a
# larger one would need a (sparse) file past what ext4 allows (16 TiB); one such add used to fail every
# later checkpoint and leave the bookie read-only (found by the fuzzer). 2^40 entries is ~10^12.
ENTRY_ID_MAX: Final = 2**40 - 1
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
# A bookie's journal dirs: each has its own writer and fsync thread.
JOURNAL_DIRS_MAX: Final = 64
# Read files in chunks of this size: inspect never reads a whole file into memory.
FILE_READ_CHUNK: Final = 4 * 1024 * 1024

# Protobuf (metadata values, v3 frames): nesting and field counts are bounded too.
PROTOBUF_DEPTH_MAX: Final = 16
PROTOBUF_FIELDS_MAX: Final = 1_000_000

# Metadata store (bkctl.metadata). A node's data must fit ZooKeeper's default jute.maxbuffer (1 MiB
# for the whole request), so we leave room for the path and the request header.
METADATA_DATA_SIZE_MAX: Final = 1_000_000
METADATA_PATH_LENGTH_MAX: Final = 4096
# ZooKeeper applies at most this many ops in one multi as well (request size); bigger batches are split.
METADATA_MULTI_OPS_MAX: Final = 1000
# BookKeeper's zkTimeout default; the server clamps it into its [min, max] session timeout.
METADATA_SESSION_TIMEOUT_MS: Final = 10_000
METADATA_SESSION_TIMEOUT_MS_MIN: Final = 100
METADATA_SESSION_TIMEOUT_MS_MAX: Final = 600_000
# An operation that meets a lost connection or session is retried until this deadline (a ZooKeeper
# pause longer than every session timeout must not fail a healthy command), backing off 0.1 s .. 2 s.
METADATA_RETRY_DEADLINE_MS: Final = 120_000
METADATA_RETRY_DEADLINE_MS_MAX: Final = 3_600_000
METADATA_RETRY_BACKOFF_START_MS: Final = 100
METADATA_RETRY_BACKOFF_MAX_MS: Final = 2_000
METADATA_CONNECT_TIMEOUT_MS: Final = 5_000
# A process that stops waits this long for each metadata call of its stop (a bookie's unregister, an
# autorecovery daemon's vote withdrawal), then goes on stopping: with the store unreachable, what the
# call would have removed goes when the session expires.
METADATA_AT_STOP_S: Final = 5.0
# get_many(): ZooKeeper reads in flight at once (pipelined on one connection), and paths per SQLite
# `WHERE path IN (...)` query (SQLite allows 32,766 parameters; smaller chunks keep the store's lock short).
METADATA_GET_MANY_WINDOW: Final = 1000
SQLITE_GET_MANY_CHUNK: Final = 500
# A recursive delete walks at most this many nodes, so a wrong path cannot wipe an unbounded tree.
METADATA_RECURSIVE_DELETE_MAX: Final = 10_000_000
# SQLite backend: how often watches poll the change log, how often expired leases are looked for, and
# how long change-log rows are kept for slow pollers (older gaps make every watch re-read its node).
SQLITE_WATCH_POLL_MS: Final = 10
SQLITE_REAP_INTERVAL_MS: Final = 100
SQLITE_CHANGELOG_RETENTION_MS: Final = 60_000

# Client adds (bkctl.protocol.quorum.AckTracker): entries acked out of order ahead of the LAC.
PENDING_ADDS_MAX: Final = 100_000

# Metadata store values other than ledger metadata (cookies, marks, votes, layouts, service info):
# small text or protobuf; ZooKeeper's own znode limit (jute.maxbuffer) is 1 MiB.
METADATA_VALUE_SIZE_MAX: Final = 1024 * 1024

# Bookie server (bkctl.server.protocol): adds one connection may have waiting for the journal's fsync
# before the bookie stops reading from it (backpressure); reading resumes below half of it.
BOOKIE_PENDING_ADDS_PER_CONNECTION_MAX: Final = 10_000
# Bytes the bookie asks for per socket read (Twisted's default is 64 KiB). A saturated bookie finds more
# than that waiting at each read: 256 KiB takes ~230 adds of 1 KiB per reactor turn instead of ~55, and
# each turn's fixed costs (frame loop, journal write, replies) are shared by more adds. Measured with the
# Java client at 512 in flight: bookie CPU per add 10.3-13.1 -> 8.8-10.6 us, +4-8% adds/s (1 MiB: no
# better, and a longer p99). The read returns what is there: an idle connection's reads stay small.
BOOKIE_READ_SIZE: Final = 256 * 1024
# Replies a client does not read are bounded by the transport: the bookie registers each connection as
# a streaming producer and stops reading it while Twisted's write buffer is over its 64 KiB mark.

# Ledger client (bkctl.client). Java's addEntryTimeoutSec / readEntryTimeoutSec default to 5 s.
CLIENT_REQUEST_TIMEOUT_MS: Final = 5_000
CLIENT_CONNECT_TIMEOUT_MS: Final = 5_000
# Reconnect backoff per bookie: requests fail fast while it lasts; it doubles per failed attempt.
CLIENT_RECONNECT_BACKOFF_MS_MIN: Final = 50
CLIENT_RECONNECT_BACKOFF_MS_MAX: Final = 2_000
# Requests one bookie connection may have unanswered (timed-out ones count until their late reply).
CLIENT_REQUESTS_PER_BOOKIE_MAX: Final = 100_000
# Adds a ledger handle has sent and not yet acknowledged; more adds wait (up to the second bound).
CLIENT_ADDS_IN_FLIGHT_MAX: Final = 10_000
CLIENT_ADDS_WAITING_MAX: Final = 100_000
# Entries one range read has in flight, and entries one read call may ask for.
CLIENT_READS_IN_FLIGHT_MAX: Final = 256
CLIENT_READ_RANGE_MAX: Final = 1_000_000
# Ensemble changes in a row (each replacing failed bookies) before the writer gives up.
CLIENT_ENSEMBLE_CHANGES_MAX: Final = 16
# Metadata compare-and-swap attempts of one client operation (ensemble change, close, recovery).
CLIENT_METADATA_CAS_MAX: Final = 100
# Entries recovery reads past the LAC before it gives up (a writer never has more outstanding).
CLIENT_RECOVERY_ENTRIES_MAX: Final = 1_000_000
# Recovery reads in flight past the LAC (BookKeeper's recoveryReadBatchSize idea); 1 = one at a time.
CLIENT_RECOVERY_READS_IN_FLIGHT: Final = 32
CLIENT_RECOVERY_READS_IN_FLIGHT_MAX: Final = 1_024
# `ledger write`: entries per add_many call and such calls in flight; `ledger read`: entries per read call.
CLI_WRITE_CHUNK_ENTRIES: Final = 1_000
CLI_WRITE_CHUNKS_IN_FLIGHT: Final = 4
CLI_READ_CHUNK_ENTRIES: Final = 1_000
# `sandbox`: bookies one sandbox runs; seconds a bookie process may take to serve, and to stop. A child
# that exits is seen at once, so the start bound only ends a hung one: generous, because on a loaded
# machine the interpreter's imports alone have taken 40 s.
SANDBOX_BOOKIES_MAX: Final = 32
SANDBOX_BOOKIE_START_WAIT_S: Final = 90.0
SANDBOX_BOOKIE_STOP_WAIT_S: Final = 30.0

# Generated ledger ids whose node already exists (ledgers created under explicit ids or imported) are
# skipped at most this many times per create before giving up.
LEDGER_ID_SKIPS_MAX: Final = 10_000

# Ledgers one autorecovery daemon repairs at once (`autorecovery start --parallel`): a small ledger's
# repair waits on round trips (ZooKeeper, the bookies' journals) far more than it computes.
REPLICATION_PARALLEL_DEFAULT: Final = 16
# An autorecovery daemon's metadata requests a second (replicationMetadataOpsPerSecond): a repair of a
# small ledger asks ZooKeeper about 4, so this is ~250 ledgers/s per daemon, a sliver of what a
# ZooKeeper ensemble serves (tens of thousands a second).
REPLICATION_METADATA_OPS_DEFAULT: Final = 1_000
