"""HTTPS on the main listener (DESIGN §12 `tls: {certFile, keyFile}`).

`TlsReloader` owns the server's TLS: TLS 1.2 or later, ALPN `http/1.1`, and the
certificate and key re-read when either file changes (cert-manager rotates them by a
symlink swap in a Secret volume), so new handshakes get the new certificate without
a restart. A pair that does not load keeps the last good one in force, is logged once
per change and shows in `ready()` (a `/readyz` detail, never a reason for 503: the old
certificate still serves).

The listening `SSLContext` hands every handshake to the context built from the last
good pair (`sni_callback`, which OpenSSL runs for every ClientHello, with or without
SNI). A reload builds a fresh context rather than calling `load_cert_chain` on the
live one, because a failed `load_cert_chain` leaves a context without a usable key:
every later handshake would fail.

`TlsSite` is aiohttp's `TCPSite` with the handshake bounded by `limits.headerTimeout`
(asyncio's default is 60 s, and the header timeout starts only after the handshake).
`metricsListen` stays plain HTTP.

`python -m sidecar.tls` is the container's health probe: `/healthz` on the port of
`$SIDECAR_LISTEN` over HTTPS, or plain HTTP when the listener does not speak TLS.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sidecar.config import ConfigError, TlsConfig

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


@dataclass(frozen=True)
class Loaded:
    """One certificate and key pair, loaded."""

    context: ssl.SSLContext
    serial: int
    not_after: str


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"config key {key!r}: cannot read {path}: {exc.strerror}") from None


def load_pair(cert_file: str, key_file: str, cert: bytes, key: bytes) -> Loaded:
    """A fresh context from the files, or ConfigError naming the key at fault.

    `cert` and `key` are the bytes just read from the files; they name the fault
    precisely (`load_cert_chain` reads the paths itself and only says "PEM lib")."""
    try:
        leaf = x509.load_pem_x509_certificates(cert)[0]
    except ValueError:
        raise ConfigError(
            f"config key {CERT_KEY!r}: {cert_file} holds no PEM certificate"
        ) from None
    try:
        serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise ConfigError(
            f"config key {KEY_KEY!r}: {key_file} holds no unencrypted PEM private key"
        ) from None
    context = server_context()
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or "does not load"
        raise ConfigError(
            f"config key {KEY_KEY!r}: {key_file} does not match the certificate in "
            f"{cert_file} ({reason})"
        ) from None
    return Loaded(context, leaf.serial_number, leaf.not_valid_after_utc.isoformat())


class TlsReloader:
    """The listener's TLS context and the poll that re-reads the pair when it changes."""

    def __init__(self, cfg: TlsConfig, interval: float = POLL_SECONDS) -> None:
        if cfg.cert_file is None or cfg.key_file is None:
            raise ConfigError(f"config keys {CERT_KEY!r} and {KEY_KEY!r} must be set together")
        self.cert_file = cfg.cert_file
        self.key_file = cfg.key_file
        self.interval = interval
        snapshot = self._snapshot()
        self.current = load_pair(self.cert_file, self.key_file, *snapshot)
        # What the files held at the last poll: their bytes, or why they could not be read.
        self._seen: tuple[bytes, bytes] | str = snapshot
        self.failed = False
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
        """One poll: when either file's contents changed, load the pair. True when a
        new certificate came into force. A write that lands while the files are being
        loaded changes them again, so it is loaded on the next poll."""
        try:
            now: tuple[bytes, bytes] | str = self._snapshot()
        except ConfigError as exc:
            now = str(exc)
        if now == self._seen:
            return False
        self._seen = now
        try:
            if isinstance(now, str):
                raise ConfigError(now)
            self.current = load_pair(self.cert_file, self.key_file, *now)
        except ConfigError as exc:
            self.failed = True
            log.warning(
                "TLS certificate reload refused; the last good certificate is serving (%s): %s",
                self._describe(),
                exc,
            )
            return False
        self.failed = False
        log.info("TLS certificate reloaded: %s", self._describe())
        return True

    def ready(self) -> tuple[bool, str]:
        if self.failed:
            return False, (
                "TLS certificate reload failed (see the log); the last good certificate "
                f"is serving ({self._describe()})"
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


class TlsSite(web.TCPSite):
    """`web.TCPSite` over TLS with the handshake bounded by `handshake_timeout`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        context: ssl.SSLContext,
        handshake_timeout: float,
        shutdown_timeout: float,
        reuse_port: bool | None,
    ) -> None:
        super().__init__(
            runner,
            host,
            port,
            ssl_context=context,
            shutdown_timeout=shutdown_timeout,
            reuse_port=reuse_port,
        )
        self._handshake_timeout = handshake_timeout

    async def start(self) -> None:
        # TCPSite.start without its fixed 60 s handshake allowance.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._handshake_timeout,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


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
