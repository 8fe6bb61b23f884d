"""Credential reload (DESIGN §4): the token file and the JWT key / JWKS files are
re-read when they change, and at once on SIGHUP (`request`).

A change is noticed by polling a fingerprint (mtime, size, inode) of each file once a
`interval`. The fingerprint is taken before the files are read, so a write that lands
while they are being read changes it again and is read on the next poll. A file that
fails to load keeps the last good credentials in force, is logged, and shows in
`/readyz` (`ready`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence

from sidecar.config import ConfigError, IdentityConfig
from sidecar.identity.stage import IdentityStage, build_authenticators

log = logging.getLogger("sidecar.identity")

# How often the credential files are checked for a change (one stat() each).
CREDENTIAL_POLL_SECONDS = 1.0

Fingerprint = tuple[tuple[int, int, int] | None, ...]


def credential_files(cfg: IdentityConfig) -> list[str]:
    return [p for p in (cfg.token_file, cfg.jwt.public_key_file, cfg.jwt.jwks_file) if p]


def _fingerprint(paths: Sequence[str]) -> Fingerprint:
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class CredentialWatcher:
    """Rebuilds the identity stage's authenticators when a credential file changes or
    a reload is requested (SIGHUP)."""

    def __init__(
        self, stage: IdentityStage, cfg: IdentityConfig, interval: float = CREDENTIAL_POLL_SECONDS
    ) -> None:
        self.stage = stage
        self.cfg = cfg
        self.files = credential_files(cfg)
        self.interval = interval
        self.seen = _fingerprint(self.files)
        self.failed = False
        self.reloads = 0  # successful reloads, for tests and the log
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.files and self._task is None:
            self._task = asyncio.create_task(self._watch(), name="credential-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def request(self) -> None:
        """Re-read the credential files now, changed or not (SIGHUP)."""
        self._wake.set()

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            forced = self._wake.is_set()
            self._wake.clear()
            now = _fingerprint(self.files)
            if forced or now != self.seen:
                self.seen = now
                await self.reload()

    async def reload(self) -> bool:
        try:
            found = await asyncio.to_thread(build_authenticators, self.cfg)
        except ConfigError as exc:
            self.failed = True
            log.warning(
                "credential reload refused; the last good credentials stay in force: %s", exc
            )
            return False
        self.stage.authenticators = tuple(found)
        self.reloads += 1
        if self.failed:
            log.warning("credential reload succeeded again")
        else:
            log.info("credentials reloaded")
        self.failed = False
        return True

    async def ready(self) -> tuple[bool, str]:
        if self.failed:
            return False, (
                "credential reload failed (see the log); the last good credentials are in force"
            )
        return True, "credentials loaded"
