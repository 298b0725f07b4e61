"""Administrative opens (`open_ledger(password=None)`, Java's BookKeeperAdmin.openLedger) of a ledger
whose metadata stores no password: the client's recovery password and digest are used (Java's
bookieRecoveryPasswd / bookieRecoveryDigestType); with the defaults ("" and CRC32) a MAC ledger's
entries do not verify and fencing is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bkctl.errors import BkctlError, UnauthorizedError
from bkctl.model import DigestType
from tests.client.cluster import Cluster, bounded
from tests.server_net.live import in_thread, twisted_test

PW = b"app-secret"


@twisted_test
async def test_a_ledger_storing_no_password_opens_with_the_recovery_password(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, digest=DigestType.MAC, password=PW))
        await bounded(writer.add_many([b"e%d" % i for i in range(10)]))  # left open: its writer died
        layout = cluster.layout
        assert layout is not None
        versioned = await in_thread(layout.read_ledger, writer.ledger_id)
        bare = dataclasses.replace(versioned.value, password=None, digest=None)
        await in_thread(layout.write_ledger, writer.ledger_id, bare, versioned.version)

        default = cluster.client(2)  # "" and CRC32: neither the key to fence nor the digest to read
        with pytest.raises(UnauthorizedError, match="stores no password"):
            await bounded(default.open_ledger(writer.ledger_id, None))
        with pytest.raises(BkctlError):  # the last add confirmed it reads does not verify as CRC32
            await bounded(default.open_ledger(writer.ledger_id, None, recovery=False))

        admin = cluster.client(3)
        admin.recovery_password, admin.recovery_digest = PW, DigestType.MAC
        recovered = await bounded(admin.open_ledger(writer.ledger_id, None))
        assert recovered.is_closed and recovered.last_add_confirmed == 9
        assert [e.payload for e in await bounded(recovered.read(0, 9))] == [b"e%d" % i for i in range(10)]
    finally:
        await cluster.stop()
