"""The autorecovery daemon's keys in a bk_server.conf, with Java's names, units and defaults."""

from __future__ import annotations

from collections.abc import Mapping

from bkctl import limits
from bkctl.errors import UsageError
from bkctl.model import DigestType
from bkctl.protocol.properties import bool_key, int_key
from bkctl.recovery.auditor import AuditorConfig
from bkctl.recovery.worker import WorkerConfig

DAY_S = 86_400  # format fact
INT_MAX = 2**31 - 1  # format fact
# Every key `daemon_config` reads, and the one that turns the daemon on (for the list of unused keys).
DAEMON_KEYS = (
    "autoRecoveryDaemonEnabled",
    "auditorPeriodicBookieCheckInterval",
    "auditorPeriodicCheckInterval",
    "bookieRecoveryDigestType",
    "bookieRecoveryPasswd",
    "lockReleaseOfFailedLedgerGracePeriod",
    "lostBookieRecoveryDelay",
    "openLedgerRereplicationGracePeriod",
    "rwRereplicateBackoffMs",
    "auditorPeriodicPlacementPolicyCheckInterval",
    "repairedPlacementPolicyNotAdheringBookieEnable",
    "replicationMetadataOpsPerSecond",
    "replicationNewestFirst",
    "replicationRateByBytes",
)


def daemon_config(
    properties: Mapping[str, str], *, parallel: int | None = None
) -> tuple[AuditorConfig, WorkerConfig]:
    """AuditorConfig and WorkerConfig from the keys present; absent keys keep Java's defaults."""
    auditor, worker = AuditorConfig(), WorkerConfig()

    def get(key: str, default: float, low: int, high: int) -> int:
        value = properties.get(key)
        return int(default) if value is None else int_key(key, value, low, high)

    auditor = AuditorConfig(
        lost_bookie_recovery_delay_s=get(
            "lostBookieRecoveryDelay", auditor.lost_bookie_recovery_delay_s, 0, INT_MAX
        ),
        periodic_bookie_check_interval_s=get(
            "auditorPeriodicBookieCheckInterval", auditor.periodic_bookie_check_interval_s, 0, 365 * DAY_S
        ),
        periodic_check_interval_s=get(
            "auditorPeriodicCheckInterval", auditor.periodic_check_interval_s, 0, 365 * DAY_S
        ),
        placement_check_interval_s=get(
            "auditorPeriodicPlacementPolicyCheckInterval", auditor.placement_check_interval_s, 0, 365 * DAY_S
        ),
        repair_placement=bool_key(
            "repairedPlacementPolicyNotAdheringBookieEnable",
            properties.get("repairedPlacementPolicyNotAdheringBookieEnable", "false"),
        ),
    )
    ms = 1000.0
    worker = WorkerConfig(
        parallel=worker.parallel if parallel is None else parallel,
        poll_interval_s=worker.poll_interval_s,
        open_ledger_grace_s=get(
            "openLedgerRereplicationGracePeriod", worker.open_ledger_grace_s * ms, 0, 7 * DAY_S * 1000
        )
        / ms,
        backoff_start_s=get("rwRereplicateBackoffMs", worker.backoff_start_s * ms, 1, DAY_S * 1000) / ms,
        backoff_max_s=get(
            "lockReleaseOfFailedLedgerGracePeriod", worker.backoff_max_s * ms, 1, 7 * DAY_S * 1000
        )
        / ms,
        recovery_password=_password(properties.get("bookieRecoveryPasswd")),
        recovery_digest=DigestType.parse(properties.get("bookieRecoveryDigestType", "CRC32")),
        replication_rate_bytes=get("replicationRateByBytes", -1, -1, 2**62),
        newest_first=bool_key("replicationNewestFirst", properties.get("replicationNewestFirst", "false")),
        metadata_ops_per_s=_ops_rate(properties.get("replicationMetadataOpsPerSecond")),
    )
    return auditor, worker


def _ops_rate(value: str | None) -> int | None:
    """replicationMetadataOpsPerSecond: 0 for no limit; absent, the default."""
    if value is None:
        return limits.REPLICATION_METADATA_OPS_DEFAULT
    return int_key("replicationMetadataOpsPerSecond", value, 0, INT_MAX) or None


def _password(value: str | None) -> bytes:
    secret = (value or "").encode("utf-8")
    if len(secret) > limits.PASSWORD_SIZE_MAX:
        raise UsageError(f"bookieRecoveryPasswd of {len(secret)} bytes: at most {limits.PASSWORD_SIZE_MAX}")
    return secret
