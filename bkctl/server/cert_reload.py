"""Java's `tlsCertFilesRefreshDurationSeconds`: the bookie looks at its TLS files every so often and,
when one changed, builds a new context that the next START_TLS uses (connections already protected
keep theirs). A file that does not load (half written, wrong key) keeps the old context, is logged,
and is looked at again next time; the bookie never stops serving TLS over it.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

from twisted.internet import task

from bkctl.errors import UsageError
from bkctl.tls import TlsSettings, files_stamp, server_context

log = logging.getLogger("bkctl.bookie")


class CertificateReloader:
    def __init__(
        self, settings: TlsSettings, use: Callable[[ssl.SSLContext], None], reactor: Any, period_s: float
    ) -> None:
        self._settings, self._use, self._period_s = settings, use, period_s
        self._stamp = files_stamp(settings.files)
        self._loop = task.LoopingCall(self.check)
        self._loop.clock = reactor

    def start(self) -> None:
        self._loop.start(self._period_s, now=False).addErrback(
            lambda f: log.error("TLS certificate reload stopped: %s", f.getErrorMessage())
        )

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def check(self) -> bool:
        """Reload when a file changed since the last load; True when a new context is in use."""
        stamp = files_stamp(self._settings.files)
        if stamp == self._stamp:
            return False
        try:
            context = server_context(self._settings)
        except UsageError as exc:
            log.warning("bookie: TLS files changed but do not load, keeping the current ones: %s", exc)
            return False
        self._stamp = stamp
        self._use(context)
        log.info("bookie: TLS certificate files reloaded; new connections use them")
        return True
