"""HTTPS on the main listener (DESIGN §12 `tls: {certFile, keyFile}`).

`TlsReloader` owns the server's TLS: TLS 1.2 or later, ALPN `http/1.1`, and the
certificate and key re-read when either file changes (cert-manager rotates them by a
symlink swap in a Secret volume), so new handshakes get the new certificate without
a restart. A pair that does not load keeps the last good one in force, is logged once
per change and shows in `ready()` (a `/readyz` detail, never a reason for 503: the old
certificate still serves). A certificate outside its validity (expired, or not valid
yet) does not load (DESIGN §4), at start-up or on reload; one refused only because its
time has not come yet is tried again on each poll, so it comes into force when it does
(an issuer's clock a little ahead of this one's must not strand it until the next
rotation). `ready()` always says until when the serving certificate is valid, and
fails once it has expired.

The listening `SSLContext` hands every handshake to the context built from the last
good pair (`sni_callback`, which OpenSSL runs for every ClientHello, with or without
SNI). A reload builds a fresh context rather than calling `load_cert_chain` on the
live one, because a failed `load_cert_chain` leaves a context without a usable key:
every later handshake would fail.

`TlsSite` is an aiohttp site with the handshake bounded by `limits.headerTimeout`
(asyncio's default is 60 s, and the header timeout starts only after the handshake).
`metricsListen` stays plain HTTP.

`python -m sidecar.edge.tls` is the container's health probe: `/healthz` on the port of
`$SIDECAR_LISTEN` over HTTPS, or plain HTTP when the listener does not speak TLS.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sidecar.config.settings import ConfigError, TlsConfig

log = logging.getLogger("sidecar")

POLL_SECONDS = 1.0
CERT_KEY = "tls.certFile"
KEY_KEY = "tls.keyFile"


def server_context() -> ssl.SSLContext:
    """A server context with the sidecar's protocol settings and no certificate yet."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


Clock = Callable[[], datetime.datetime]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class PairError(ConfigError):
    """A pair that does not load: `str()` names the config key, the file and the
    problem; `public` the key and the problem only (for `/readyz`, which names no file
    path). `valid_from`: set when the only problem is that the certificate is not
    valid yet (it is tried again from then on)."""

    def __init__(
        self,
        key: str,
        path: str,
        problem: str,
        public_problem: str | None = None,
        valid_from: datetime.datetime | None = None,
    ) -> None:
        super().__init__(f"config key {key!r}: {path}: {problem}")
        self.public = f"{key}: {public_problem or problem}"
        self.valid_from = valid_from


@dataclass(frozen=True)
class Loaded:
    """One certificate and key pair, loaded."""

    context: ssl.SSLContext
    serial: int
    not_after: str
    expires: datetime.datetime


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise PairError(key, path, f"cannot read it: {exc.strerror}") from None


def load_pair(
    cert_file: str, key_file: str, cert: bytes, key: bytes, now: datetime.datetime | None = None
) -> Loaded:
    """A fresh context from the files, or PairError naming the key at fault.

    `cert` and `key` are the bytes just read from the files; they name the fault
    precisely (`load_cert_chain` reads the paths itself and only says "PEM lib").
    The certificate must be valid at `now` (default: the current time)."""
    try:
        leaf = x509.load_pem_x509_certificates(cert)[0]
    except ValueError:
        raise PairError(CERT_KEY, cert_file, "no PEM certificate in it") from None
    try:
        serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise PairError(KEY_KEY, key_file, "no unencrypted PEM private key in it") from None
    _check_validity(cert_file, leaf, now or utc_now())
    context = server_context()
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or "does not load"
        raise PairError(
            KEY_KEY,
            key_file,
            f"the key does not match the certificate in {cert_file} ({reason})",
            f"the key does not match the certificate ({reason})",
        ) from None
    expires = leaf.not_valid_after_utc
    return Loaded(context, leaf.serial_number, expires.isoformat(), expires)


def _check_validity(cert_file: str, leaf: x509.Certificate, now: datetime.datetime) -> None:
    """PairError unless `now` lies within the certificate's validity (DESIGN §4)."""
    serial = f"{leaf.serial_number:x}"
    if now > leaf.not_valid_after_utc:
        raise PairError(
            CERT_KEY,
            cert_file,
            f"the certificate expired at {leaf.not_valid_after_utc.isoformat()} (serial {serial})",
        )
    if now < leaf.not_valid_before_utc:
        raise PairError(
            CERT_KEY,
            cert_file,
            f"the certificate is not valid before {leaf.not_valid_before_utc.isoformat()} "
            f"(serial {serial})",
            valid_from=leaf.not_valid_before_utc,
        )


class TlsReloader:
    """The listener's TLS context and the poll that re-reads the pair when it changes."""

    def __init__(
        self, cfg: TlsConfig, interval: float = POLL_SECONDS, clock: Clock = utc_now
    ) -> None:
        if cfg.cert_file is None or cfg.key_file is None:
            raise ConfigError(f"config keys {CERT_KEY!r} and {KEY_KEY!r} must be set together")
        self.cert_file = cfg.cert_file
        self.key_file = cfg.key_file
        self.interval = interval
        self.clock = clock
        snapshot = self._snapshot()
        self.current = load_pair(self.cert_file, self.key_file, *snapshot, now=clock())
        # What the files held at the last poll: their bytes, or why they could not be read.
        self._seen: tuple[bytes, bytes] | str = snapshot
        self.failed = False
        # Why the last change was refused (config key and problem, no path), for /readyz.
        self.problem = ""
        # The refused pair is only not valid yet: tried again from this time on.
        self._retry_from: datetime.datetime | None = None
        self.context = server_context()
        self.context.sni_callback = self._pick
        self._task: asyncio.Task[None] | None = None
        log.info("TLS certificate loaded: %s", self._describe())

    def _pick(self, conn: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        conn.context = self.current.context

    def _snapshot(self) -> tuple[bytes, bytes]:
        return _read(CERT_KEY, self.cert_file), _read(KEY_KEY, self.key_file)

    def _describe(self) -> str:
        return f"serial {self.current.serial:x}, valid until {self.current.not_after}"

    def check(self) -> bool:
        """One poll: when either file's contents changed (or a pair refused as not valid
        yet has become valid), load the pair. True when a new certificate came into
        force. A write that lands while the files are being loaded changes them again,
        so it is loaded on the next poll."""
        now = self.clock()
        unreadable: PairError | None = None
        try:
            seen: tuple[bytes, bytes] | str = self._snapshot()
        except PairError as exc:
            seen, unreadable = str(exc), exc
        if seen == self._seen and (self._retry_from is None or now < self._retry_from):
            return False
        self._seen = seen
        self._retry_from = None
        try:
            if unreadable is not None:
                raise unreadable
            assert not isinstance(seen, str)
            self.current = load_pair(self.cert_file, self.key_file, *seen, now=now)
        except PairError as exc:
            self.failed = True
            self.problem = exc.public
            self._retry_from = exc.valid_from
            log.warning(
                "TLS certificate reload refused; the last good certificate is serving (%s): %s",
                self._describe(),
                exc,
            )
            return False
        self.failed = False
        self.problem = ""
        log.info("TLS certificate reloaded: %s", self._describe())
        return True

    def ready(self) -> tuple[bool, str]:
        """Until when the serving certificate is valid, and why a new pair was refused;
        not ok while a refusal stands or once the serving certificate has expired."""
        serving = self.current
        if self.clock() > serving.expires:
            expired = (
                f"the serving certificate (serial {serving.serial:x}) expired at "
                f"{serving.not_after}; install a valid pair"
            )
            if self.failed:
                expired += f" (the last one was refused: {self.problem})"
            return False, expired
        if self.failed:
            return False, (
                f"TLS certificate reload refused ({self.problem}); the last good "
                f"certificate is serving ({self._describe()})"
            )
        return True, f"TLS certificate {self._describe()}"

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="tls-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self.check)
            except Exception:  # the poll must outlive any surprise; the old pair serves
                log.exception("TLS certificate check failed")


# aiohttp's sites' default listen backlog.
BACKLOG = 128


class TlsSite(web.BaseSite):
    """A listening site over TLS with the handshake bounded by `handshake_timeout`.

    aiohttp's `TCPSite` gives every handshake asyncio's fixed 60 s; this site makes
    its own server from the runner's public `server` (a protocol factory) with
    `ssl_handshake_timeout`, and closes it in `stop`. Public aiohttp API only
    (`BaseSite.start`/`stop` register the site with its runner)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        context: ssl.SSLContext,
        handshake_timeout: float,
        reuse_port: bool | None,
    ) -> None:
        super().__init__(runner)
        self.runner = runner
        self.host = host
        self.requested_port = port
        self.context = context
        self.handshake_timeout = handshake_timeout
        self.reuse_port = reuse_port
        self.listener: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port once started (also when 0 was asked for), else the asked one."""
        sockets = self.listener.sockets if self.listener is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else self.requested_port

    @property
    def name(self) -> str:
        host = self.host or "0.0.0.0"
        return f"https://[{host}]:{self.port}" if ":" in host else f"https://{host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self.runner.server
        assert server is not None
        self.listener = await asyncio.get_running_loop().create_server(
            server,
            self.host,
            self.requested_port,
            ssl=self.context,
            ssl_handshake_timeout=self.handshake_timeout,
            backlog=BACKLOG,
            reuse_port=self.reuse_port,
        )

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()
        await super().stop()


def probe(listen: str) -> bool:
    """True when `/healthz` on `listen` answers, over HTTPS (unverified: the probe
    runs on the sidecar's own host) or, when the listener does not speak TLS, HTTP."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    for scheme in ("https", "http"):
        try:
            with urllib.request.urlopen(
                f"{scheme}://{host}:{port}/healthz", timeout=2, context=unverified
            ) as response:
                return bool(response.status == 200)
        except urllib.error.URLError as exc:
            if not isinstance(exc.reason, ssl.SSLError):
                return False
        except OSError:
            return False
    return False


if __name__ == "__main__":
    sys.exit(0 if probe(os.environ.get("SIDECAR_LISTEN", "127.0.0.1:8443")) else 1)
