"""Reading one bookie's copies of a ledger's entries (`ledger read --bookie`): no replica fallback,
so an operator sees exactly what that bookie holds."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred

from bkctl import limits
from bkctl.client.bookie_client import rc_text
from bkctl.client.reads import LedgerEntry
from bkctl.errors import ProtocolError
from bkctl.protocol import entry_availability, wire
from bkctl.protocol.entry import parse_entry, verify_entry
from bkctl.protocol.entry_availability import Holdings

if TYPE_CHECKING:
    from bkctl.client.ledger import LedgerHandle

_EOK = int(wire.ReturnCode.EOK)
_ENOLEDGER = int(wire.ReturnCode.ENOLEDGER)


def read_from_bookie(
    handle: LedgerHandle, bookie: str, entry_ids: Sequence[int]
) -> Deferred[tuple[list[LedgerEntry], list[tuple[int, str]]]]:
    """(entries read and verified, in order; (entry id, why) for each one the bookie could not give)."""
    done: Deferred[tuple[list[LedgerEntry], list[tuple[int, str]]]] = Deferred()
    found: dict[int, LedgerEntry] = {}
    failed: dict[int, str] = {}
    connection = handle.client.bookies.get(bookie)
    queue = list(reversed(entry_ids))
    outstanding = [0]

    def finish() -> None:
        entries = [found[e] for e in entry_ids if e in found]
        done.callback((entries, sorted(failed.items())))

    def answer(entry_id: int, rc: int, body: bytes) -> None:
        outstanding[0] -= 1
        if rc != _EOK:
            failed[entry_id] = rc_text(rc)
        else:
            try:
                e = verify_entry(body, handle.digest, handle.ledger_id, entry_id, handle.mac)
                found[entry_id] = LedgerEntry(
                    e.ledger_id, e.entry_id, e.payload, e.last_add_confirmed, e.length
                )
            except ProtocolError as exc:
                failed[entry_id] = f"bad copy: {exc}"
        send()

    def send() -> None:
        while queue and outstanding[0] < limits.CLIENT_READS_IN_FLIGHT_MAX:
            entry_id = queue.pop()
            outstanding[0] += 1
            connection.read(handle.ledger_id, entry_id, partial(answer, entry_id))
        if not queue and outstanding[0] == 0 and not done.called:
            finish()

    send()
    return done


def last_entry_on(handle: LedgerHandle, bookie: str) -> Deferred[int]:
    """The highest entry id `bookie` holds for the ledger (a read of entry -1), or -1 if none or it
    cannot say; confirmed or not, so an operator sees the unconfirmed tail too."""
    done: Deferred[int] = Deferred()

    def answer(rc: int, body: bytes) -> None:
        entry_id = -1
        if rc == _EOK:
            try:
                entry_id = parse_entry(body, handle.digest).entry_id
            except ProtocolError:
                entry_id = -1
        done.callback(entry_id)

    handle.client.bookies.get(bookie).read(handle.ledger_id, wire.LAST_ENTRY_ID, answer)
    return done


def entries_held(handle: LedgerHandle, bookie: str) -> Deferred[Holdings | None]:
    """Which of the ledger's entries `bookie` holds (GET_LIST_OF_ENTRIES_OF_LEDGER over v3, one request
    whatever the ledger's size); None when it cannot say (down, or a bookie older than the request)."""
    done: Deferred[Holdings | None] = Deferred()

    def answer(rc: int, body: bytes) -> None:
        held = Holdings([]) if rc == _ENOLEDGER else None
        if rc == _EOK:
            with contextlib.suppress(ProtocolError):  # undecodable: judged by the reads alone
                held = Holdings(entry_availability.decode(body))
        done.callback(held)

    handle.client.bookies.v3(bookie).entries_of_ledger(handle.ledger_id, answer)
    return done
