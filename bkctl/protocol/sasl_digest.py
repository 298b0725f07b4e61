"""SASL DIGEST-MD5 (RFC 2831), the server's side, as Java's DigestMD5Server answers a bookie's clients.

The client's side is pure-sasl's; no maintained Python library has the server's, so this module is
the small state machine Java's SASLBookieAuthProvider runs: the client's first token is empty, the
server answers a challenge (realm, nonce, qop=auth, charset=utf-8, algorithm=md5-sess), the client
sends its digest response, the server checks it against the JAAS `Bookie` section's accounts and
answers `rspauth`; then the connection is authenticated. Only qop=auth (no integrity or privacy
layer), as BookKeeper uses it. Pure: tokens in, tokens out; every refusal is a ProtocolError with
the reason (the bookie logs it and answers EUA).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Final

from bkctl.errors import ProtocolError

# Java's SaslConstants: the protocol and the dummy host name DIGEST-MD5 uses on both sides.
SERVICE: Final = "bookkeeper"
HOST: Final = "bookkeeper"
REALM: Final = "bookkeeper"
TOKEN_SIZE_MAX: Final = 4096  # format fact: RFC 2831, a digest-response is at most 4096 bytes
_DIRECTIVE = re.compile(r'\s*([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*(?:,|$)')


def parse_directives(token: bytes) -> dict[str, str]:
    """`a=b,c="d\\"e"` -> {"a": "b", "c": 'd"e'}; ProtocolError if it is not such a list."""
    if len(token) > TOKEN_SIZE_MAX:
        raise ProtocolError(f"DIGEST-MD5 token of {len(token)} bytes (at most {TOKEN_SIZE_MAX})")
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("DIGEST-MD5 token is not UTF-8") from None
    directives: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _DIRECTIVE.match(text, position)
        if match is None or match.end() == position:
            raise ProtocolError(f"DIGEST-MD5 token is not a directive list at {text[position:][:20]!r}")
        quoted, bare = match.group(2), match.group(3)
        directives[match.group(1).lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        position = match.end()
    return directives


def _h(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def _hex(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).hexdigest().encode()


def response_value(user: str, password: str, d: Mapping[str, str], *, a2_prefix: bytes) -> bytes:
    """RFC 2831 2.1.2.1: the request-digest (a2_prefix b"AUTHENTICATE") or rspauth (b"")."""
    a1 = b":".join(
        [
            _h(b":".join(s.encode("utf-8") for s in (user, d.get("realm", ""), password))),
            d["nonce"].encode(),
            d["cnonce"].encode(),
        ]
    )
    if d.get("authzid"):
        a1 += b":" + d["authzid"].encode("utf-8")
    a2 = a2_prefix + b":" + d["digest-uri"].encode()
    fields = (d["nonce"], d["nc"], d["cnonce"], d.get("qop", "auth"))
    return _hex(_hex(a1) + b":" + b":".join(f.encode() for f in fields) + b":" + _hex(a2))


class DigestMd5Server:
    """One connection's DIGEST-MD5 exchange. `users`: {name: password} (the JAAS `user_NAME` options);
    `allowed(name)`: Java's saslJaasClientAllowedIds rule."""

    def __init__(
        self, users: Mapping[str, str], allowed: Callable[[str], bool], nonce: str | None = None
    ) -> None:
        self._users = users
        self._allowed = allowed
        self._nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode()
        self._challenged = False
        self.complete = False
        self.user: str | None = None

    def step(self, token: bytes) -> bytes:
        """The next server token for the client's `token`; ProtocolError when the client is refused."""
        if self.complete:
            raise ProtocolError("DIGEST-MD5 exchange already complete")
        if not self._challenged:
            if token:
                raise ProtocolError("DIGEST-MD5 takes no initial response")
            self._challenged = True
            return (
                f'realm="{REALM}",nonce="{self._nonce}",qop="auth",charset=utf-8,algorithm=md5-sess'
            ).encode()
        return self._verify(parse_directives(token))

    def _verify(self, d: dict[str, str]) -> bytes:
        for key in ("username", "nonce", "cnonce", "nc", "digest-uri", "response"):
            if key not in d:
                raise ProtocolError(f"DIGEST-MD5 response has no {key}")
        user = d["username"]
        if d["nonce"] != self._nonce:
            raise ProtocolError("DIGEST-MD5 response for another nonce")
        if d.get("qop", "auth") != "auth":
            raise ProtocolError(f"DIGEST-MD5 qop {d['qop']!r}: only auth is offered")
        if d["digest-uri"] != f"{SERVICE}/{HOST}":
            raise ProtocolError(f"DIGEST-MD5 digest-uri {d['digest-uri']!r} is not {SERVICE}/{HOST}")
        password = self._users.get(user)
        expected = response_value(user, password or "", d, a2_prefix=b"AUTHENTICATE")
        if password is None or not hmac.compare_digest(expected, d["response"].encode()):
            raise ProtocolError(f"DIGEST-MD5: wrong user name or password for {user!r}")
        if d.get("authzid") and d["authzid"] != user:
            raise ProtocolError(f"DIGEST-MD5: {user!r} may not act as {d['authzid']!r}")
        if not self._allowed(user):
            raise ProtocolError(f"DIGEST-MD5: {user!r} is not an allowed id (saslJaasClientAllowedIds)")
        self.complete, self.user = True, user
        return b"rspauth=" + response_value(user, password, d, a2_prefix=b"")
