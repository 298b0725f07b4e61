"""Administrative opens: `bkctl ledger read|fence|check` on ledgers a Java BookKeeper 4.14.8
application wrote with password 'testpasswd', without being told the password.

The three Java bookies of snapshot 1 are served by bkctl bookies from copies of their directories, with
the ledger metadata of ZooKeeper dump 1 in SQLite (tests/client/test_java_data.py); the commands run as
subprocesses. A ledger whose metadata stores no password: tests/commands/test_ledger_commands.py.
Java clients writing to bkctl bookies, then bkctl reading without the password, were also checked by
hand with scripts/java-interop-admin-open (docs/commands/ledger.md).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tests.client.cluster import Cluster
from tests.client.test_java_data import prepare, start_java_bookies
from tests.commands.sandbox_proc import bkctl
from tests.server_net.live import in_thread, twisted_test


def _run(uri: str, *args: str) -> tuple[int, str, str]:
    done = bkctl(*args, metadata=uri)
    return done.returncode, done.stdout, done.stderr


@twisted_test
async def test_java_ledgers_open_with_their_stored_password(tmp_path: Path) -> None:
    uri = await in_thread(prepare, tmp_path)
    cluster = await Cluster(tmp_path, uri).start(0)
    try:
        await start_java_bookies(cluster, tmp_path, uri)

        async def run(*args: str) -> tuple[int, str, str]:
            return await in_thread(_run, uri, *args)

        # Closed ledgers 0 (1000 entries) and 3 (200): no --password, read back whole.
        code, out, err = await run("ledger", "read", "0", "--as-text", "-o", "json")
        assert code == 0, err
        assert [e["payload"] for e in json.loads(out)] == [f"L0-E{i}" for i in range(1000)]
        code, out, err = await run("ledger", "read", "3", "--first", "198", "-o", "json")
        assert code == 0, err
        assert [base64.b64decode(e["payload_base64"]) for e in json.loads(out)] == [b"L3-E198", b"L3-E199"]

        # --password overrides and is checked.
        code, _, err = await run("ledger", "read", "0", "--last", "1", "--password", "wrong")
        assert code == 9 and "wrong password" in err
        code, out, err = await run(
            "ledger", "read", "0", "--last", "1", "--password", "testpasswd", "-o", "json"
        )
        assert code == 0 and len(json.loads(out)) == 2, err

        # check reads every entry with the stored password and digest; fence of a closed ledger: exit 11.
        code, out, err = await run("ledger", "check", "3", "--full", "-o", "json")
        assert code == 0, err
        assert {f["state"] for f in json.loads(out)["fragments"]} == {"ok"}
        code, out, err = await run("ledger", "fence", "2", "-o", "json")
        assert code == 11, err
        assert json.loads(out)["last_entry_id"] == 99

        # Ledger 1, left OPEN by its Java writer: read (no fencing) then fenced and closed where Java's
        # ReplicationWorker closed it (dump 5: last entry 49, length 290), no password given.
        code, out, err = await run("ledger", "read", "1", "-o", "json")
        assert code == 0 and len(json.loads(out)) <= 50, err
        code, out, err = await run("ledger", "fence", "1", "-o", "json")
        assert code == 0, err
        fenced = json.loads(out)
        assert (fenced["state"], fenced["last_entry_id"], fenced["length"]) == ("CLOSED", 49, 290)
        code, out, err = await run("ledger", "read", "1", "--as-text", "-o", "json")
        assert code == 0, err
        assert [e["payload"] for e in json.loads(out)] == [f"L1-E{i}" for i in range(50)]
    finally:
        await cluster.stop()
