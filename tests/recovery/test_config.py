"""The daemon's bk_server.conf keys: Java's names, units and defaults; bad values are usage errors."""

from __future__ import annotations

import inspect
import re

import pytest

from bkctl.errors import UsageError
from bkctl.model import DigestType
from bkctl.recovery.config import DAEMON_KEYS, daemon_config


def test_defaults_are_javas() -> None:
    auditor, worker = daemon_config({})
    assert auditor.lost_bookie_recovery_delay_s == 0
    assert auditor.periodic_bookie_check_interval_s == 86_400
    assert (worker.open_ledger_grace_s, worker.backoff_start_s, worker.backoff_max_s) == (30.0, 5.0, 300.0)


def test_keys_in_javas_units() -> None:
    auditor, worker = daemon_config(
        {
            "lostBookieRecoveryDelay": "60",
            "auditorPeriodicBookieCheckInterval": "0",
            "openLedgerRereplicationGracePeriod": "3000",
            "rwRereplicateBackoffMs": "250",
            "lockReleaseOfFailedLedgerGracePeriod": "60000",
            "replicationRateByBytes": "5000000",
            "replicationNewestFirst": "true",
            "replicationMetadataOpsPerSecond": "250",
        },
        parallel=8,
    )
    assert (auditor.lost_bookie_recovery_delay_s, auditor.periodic_bookie_check_interval_s) == (60, 0)
    assert (worker.open_ledger_grace_s, worker.backoff_start_s, worker.backoff_max_s) == (3.0, 0.25, 60.0)
    assert worker.parallel == 8
    assert (worker.replication_rate_bytes, worker.newest_first) == (5_000_000, True)
    assert worker.metadata_ops_per_s == 250


def test_metadata_ops_budget_by_default_and_zero_for_none() -> None:
    assert daemon_config({})[1].metadata_ops_per_s == 1_000
    assert daemon_config({"replicationMetadataOpsPerSecond": "0"})[1].metadata_ops_per_s is None


@pytest.mark.parametrize(
    "key,value",
    [
        ("lostBookieRecoveryDelay", "-1"),
        ("rwRereplicateBackoffMs", "soon"),
        ("replicationRateByBytes", "-2"),
        ("replicationNewestFirst", "maybe"),
        ("replicationMetadataOpsPerSecond", "-5"),
    ],
)
def test_bad_values_are_usage_errors(key: str, value: str) -> None:
    with pytest.raises(UsageError, match=key):
        daemon_config({key: value})


def test_recovery_password_and_digest_for_ledgers_storing_none() -> None:
    _, worker = daemon_config({})
    assert (worker.recovery_password, worker.recovery_digest) == (b"", DigestType.CRC32)
    _, worker = daemon_config({"bookieRecoveryPasswd": "s3cret", "bookieRecoveryDigestType": "MAC"})
    assert (worker.recovery_password, worker.recovery_digest) == (b"s3cret", DigestType.MAC)
    with pytest.raises(UsageError, match="digest"):
        daemon_config({"bookieRecoveryDigestType": "SHA256"})
    with pytest.raises(UsageError, match="bookieRecoveryPasswd"):
        daemon_config({"bookieRecoveryPasswd": "x" * 10_000})


def test_every_key_read_is_known_to_the_unused_keys_warning() -> None:
    read = set(re.findall(r'"([a-z][A-Za-z]+)"', inspect.getsource(daemon_config)))
    assert read - {"false"} <= set(DAEMON_KEYS)
