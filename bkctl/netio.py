"""Writing to a Twisted TCP transport now, with one `sendmsg`, instead of at the next reactor turn.

`transport.writeSequence` only queues: the bytes go out on a later reactor iteration, after an
`epoll_ctl` to watch the socket for writing, a join of the chunks into one string and another
`epoll_ctl` once sent. The bookie sends one batch of replies per connection and fsync, the client
one batch of requests per bookie and tick: small batches many times a second, where that round trip
was a visible share of the CPU and of the latency. When nothing is queued in the transport the
chunks go straight to the socket (it is non-blocking); only what the kernel does not take is queued,
so the bytes keep their order and Twisted's flow control still sees every byte it has to hold.

Used by `server/` and `client/`, for plaintext and for TLS ciphertext alike (bkctl/tls_channel.py
encrypts above the transport); it reads Twisted's FileDescriptor buffer fields (`dataBuffer`,
`_tempDataLen`, `_writeDisconnected`, `TLS`) and falls back to `writeSequence` whenever they say anything
is pending or the transport is not a plain connected TCP socket (one switched by Twisted's `startTLS`
included: bkctl no longer does that, but plaintext must never reach such a socket).
"""

from __future__ import annotations

from typing import Any

from bkctl.limits import IOV_MAX


def write_now(transport: Any, chunks: list[bytes]) -> None:
    """Send `chunks` in order: what the socket takes now goes now, the rest through the transport."""
    if not chunks:
        return
    if not _idle(transport) or len(chunks) > IOV_MAX:  # a longer batch is queued, as before
        transport.writeSequence(chunks)
        return
    try:
        sent = transport.socket.sendmsg(chunks)
    except BlockingIOError:
        sent = 0
    except OSError:
        # A reset or broken pipe: let the transport meet it on its own write and close as it does.
        transport.writeSequence(chunks)
        return
    if sent:
        chunks = _after(chunks, sent)
    if chunks:
        transport.writeSequence(chunks)


def _idle(transport: Any) -> bool:
    """Connected, not closing, and nothing queued: a direct send cannot overtake earlier bytes."""
    try:
        return bool(
            transport.connected
            and not transport.disconnecting
            and not transport._writeDisconnected
            and not transport.dataBuffer
            and not transport._tempDataLen
            and not getattr(transport, "TLS", False)  # after startTLS every byte goes through TLS
        )
    except AttributeError:  # not a FileDescriptor-based transport (a test's StringTransport)
        return False


def _after(chunks: list[bytes], sent: int) -> list[bytes]:
    """What is left of `chunks` once their first `sent` bytes are gone."""
    for index, chunk in enumerate(chunks):
        if sent < len(chunk):
            return [chunk[sent:], *chunks[index + 1 :]] if sent else chunks[index:]
        sent -= len(chunk)
    return []
