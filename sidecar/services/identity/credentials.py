"""Credential reload (DESIGN §4): the token file and the JWT key / JWKS files are
re-read when they change, and at once on SIGHUP (`request`).

A change is noticed by polling a fingerprint (mtime, size, inode) of each file once a
`interval`. The fingerprint is taken before the files are read, so a write that lands
while they are being read changes it again and is read on the next poll. A file that
fails to load (an empty one too: sidecar/services/identity/files.py) keeps the last good
credentials in force, is logged with its path, and shows in `/readyz` (`ready`) with
the config key and the problem, never the path or the file's contents.

A credential that goes away also ends the watches opened with it (DESIGN §4): after
each successful reload the `on_reload` callbacks run (sidecar/edge/watches.py authenticates
every open watch again), and `expires_at` says when a request's credential stops being
accepted by time (a JWT's `exp`), so its watches end then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Protocol

import jwt
from aiohttp import web

from sidecar.config.settings import ConfigError, IdentityConfig
from sidecar.core.identity import Identity
from sidecar.services.identity.authenticators import build_authenticators, parse_authorization
from sidecar.services.identity.files import CredentialFileError
from sidecar.services.identity.names import JWT, Authenticator

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


class Authenticating(Protocol):
    """What holds the authenticators in force (`pipeline.identity.IdentityStage`)."""

    authenticators: tuple[Authenticator, ...]


class CredentialWatcher:
    """Rebuilds the identity stage's authenticators when a credential file changes or
    a reload is requested (SIGHUP)."""

    def __init__(
        self, stage: Authenticating, cfg: IdentityConfig, interval: float = CREDENTIAL_POLL_SECONDS
    ) -> None:
        self.stage = stage
        self.cfg = cfg
        self.files = credential_files(cfg)
        self.interval = interval
        self.seen = _fingerprint(self.files)
        self.failed = False
        # Why the last reload was refused, for /readyz: key and problem, no path.
        self.problem = ""
        self.reloads = 0  # successful reloads, for tests and the log
        # Called after each successful reload (sync, cheap).
        self.on_reload: list[Callable[[], None]] = []
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
            self.problem = exc.public if isinstance(exc, CredentialFileError) else "see the log"
            log.warning(
                "credential reload refused; the last good credentials stay in force: %s", exc
            )
            return False
        except Exception:  # the watch must outlive any surprise; the old credentials stand
            self.failed = True
            self.problem = "see the log"
            log.exception("credential reload refused; the last good credentials stay in force")
            return False
        self.stage.authenticators = tuple(found)
        self.reloads += 1
        if self.failed:
            log.warning("credentials reloaded; the earlier refusal is over")
        else:
            log.info("credentials reloaded")
        self.failed = False
        self.problem = ""
        for callback in self.on_reload:
            try:
                callback()
            except Exception:  # the new credentials stand whatever a listener does
                log.exception("a credential reload listener failed")
        return True

    def expires_at(self, request: web.Request, identity: Identity) -> float | None:
        """When the credential `request` was authenticated with as `identity` stops being
        accepted by time (wall clock, seconds): a JWT's `exp` plus the configured leeway.
        None when it does not expire by time (static tokens, trusted headers, a JWT
        without `exp`). The token was verified by this request's identity stage, so its
        claims are read here without verifying it again."""
        if identity.authenticator != JWT:
            return None
        bearer, _ = parse_authorization(request)
        if bearer is None:
            return None
        try:
            claims = jwt.decode(bearer, options={"verify_signature": False})
        except jwt.PyJWTError:
            return None
        exp = claims.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, (int, float)):
            return None
        return float(exp) + self.cfg.jwt.leeway_seconds

    async def ready(self) -> tuple[bool, str]:
        if self.failed:
            return False, (
                f"credential reload refused ({self.problem}); "
                "the last good credentials are in force"
            )
        return True, "credentials loaded"
