"""One connection's TLS, sans-I/O: the standard library's `ssl.SSLObject` over two `ssl.MemoryBIO`s,
driven by the bookie's and the client's own connection code (bkctl/server/start_tls.py,
bkctl/client/start_tls.py) instead of Twisted's TLSMemoryBIOProtocol.

Why not Twisted's: it hands every TLS record's plaintext to `dataReceived` on its own (a Java client's
~15 KiB records carry ~13 adds each, several records per socket read), raises a WantReadError per read
through cffi, and its writes cannot take the one-`sendmsg` path of bkctl/netio.py. Here `receive`
returns ALL the plaintext a socket read completes, joined, so the bookie's frame loop runs once per
read; `encrypt` turns a batch of replies into ciphertext in one call (records of up to 16 KiB), which
the caller sends with `netio.write_now` like plaintext.

Ciphertext the channel produces (handshake messages, alerts, close_notify) waits in `take_output` until
the caller sends it. Failures raise TlsError with one line of reason (`certificate verify failed: ...`).
"""

from __future__ import annotations

import re
import ssl
from typing import Final

_READ_SIZE: Final = 64 * 1024  # more than a record's plaintext (16 KiB): one read call per record
_OPENSSL_LABEL: Final = re.compile(r"^\[[^\]]*\]\s*")  # "[SSL: CERTIFICATE_VERIFY_FAILED] "
_OPENSSL_LOCATION: Final = re.compile(r"\s*\(_ssl\.c:\d+\)$")  # " (_ssl.c:1006)"


class TlsError(Exception):
    """The TLS session failed (handshake, verification, a bad record, an alert from the peer); its
    message is one line. Any alert for the peer is in the channel's `take_output`."""


class TlsChannel:
    """One connection's TLS state. Feed it what the socket read; send what `take_output` and
    `encrypt` return, in the order they were made."""

    def __init__(
        self, context: ssl.SSLContext, server_side: bool, server_hostname: str | None = None
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self.handshake_done = False
        self.peer_closed = False  # the peer sent close_notify: nothing more will come
        if not server_side:
            self._handshake()  # the ClientHello, ready in take_output

    def receive(self, data: bytes) -> bytes:
        """Ciphertext from the socket in; every byte of plaintext it completes out (b"" if none, e.g.
        mid-handshake or a partial record). Raises TlsError."""
        self._incoming.write(data)
        if not self.handshake_done and not self._handshake():
            return b""
        return self._read_all()

    def encrypt(self, chunks: list[bytes]) -> bytes:
        """Plaintext chunks (a batch of replies or requests) as ciphertext, in one go."""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            self._ssl.write(data)  # without partial writes OpenSSL takes it all (the BIO grows)
        except ssl.SSLError as exc:
            raise TlsError(describe(exc)) from None
        return self._outgoing.read()

    @property
    def output_pending(self) -> bool:
        """Whether the channel made ciphertext of its own (a handshake message, an alert) to send."""
        return self._outgoing.pending > 0

    def take_output(self) -> bytes:
        """Ciphertext made by the channel itself (handshake, alert, close_notify) that awaits sending."""
        return self._outgoing.read()

    def close(self) -> bytes:
        """Our close_notify, to send before closing the connection (b"" if it cannot be made)."""
        try:
            self._ssl.unwrap()
        except ssl.SSLWantReadError:
            pass  # sent ours; the peer's close_notify is not waited for (as Java's and Twisted's)
        except (ssl.SSLError, ValueError):
            pass  # handshake not done or session already broken: no close_notify to give
        return self._outgoing.read()

    def version(self) -> str | None:
        """The protocol agreed (`TLSv1.3`), None before the handshake."""
        return self._ssl.version()

    def _handshake(self) -> bool:
        """Advance the handshake; True once it is complete."""
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as exc:
            raise TlsError(describe(exc)) from None
        self.handshake_done = True
        return True

    def _read_all(self) -> bytes:
        read = self._ssl.read
        chunks = []
        while True:
            try:
                chunk = read(_READ_SIZE)
            except ssl.SSLWantReadError:
                break  # a partial record waits for the next socket read
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            except ssl.SSLError as exc:
                raise TlsError(describe(exc)) from None
            if not chunk:  # clean close_notify
                self.peer_closed = True
                break
            chunks.append(chunk)
            if not self._incoming.pending and not self._ssl.pending():
                break  # the read ended on a record boundary: no WantRead exception needed
        if len(chunks) == 1:
            return chunks[0]
        return b"".join(chunks)


def describe(error: BaseException | None) -> str:
    """An OpenSSL error in a few words (`certificate verify failed: ...`), without the library's
    `[SSL: CODE]` label and source location."""
    if error is None:
        return "connection closed"
    if isinstance(error, TlsError):
        return str(error)
    text = _OPENSSL_LOCATION.sub("", _OPENSSL_LABEL.sub("", str(error)))
    return text or type(error).__name__
