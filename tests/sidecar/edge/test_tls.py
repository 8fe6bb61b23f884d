"""HTTPS on the main listener (`tls.certFile`/`keyFile`, DESIGN §12), against the real
sidecar and store processes: the right CA works and a wrong one is a TLS verification
error; the certificate files rotated the way cert-manager and the kubelet do it (a
symlink swap in a Secret volume) serve the new certificate without a restart; a broken
rotation keeps the old one serving and shows in `/readyz` (still 200); a missing or bad
file at start-up is one line naming the key; `metricsListen` stays plain HTTP; a stalled
handshake is dropped; the container's health probe speaks both. Through `kubectl`: a
kubeconfig with a wrong CA is a TLS error, an expired JWT a 401 `Status`."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sidecar.cli.demo import Authority, kubeconfig
from sidecar.config.settings import TlsConfig
from sidecar.edge.tls import TlsReloader, server_context
from tests.rigs import paths, processes
from tests.rigs.kube import kubectl_binary
from tests.rigs.waiting import eventually_sync

TOKENS = [
    {"token": "t-admin", "user": "admin", "tenant": "system", "groups": ["cluster-admins"]},
    {"token": "t-alice", "user": "alice", "tenant": "acme", "groups": ["tenant-admins"]},
]
JWT_SECRET = "a-test-secret-of-at-least-32-bytes!!"


class SecretVolume:
    """Files laid out as the kubelet writes a Secret volume: `tls.crt -> ..data/tls.crt`,
    `..data -> ..<version>`; `publish` swaps `..data` atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.version = 0
        self.cert_file = root / "tls.crt"
        self.key_file = root / "tls.key"

    def publish(self, cert: bytes, key: bytes) -> None:
        self.version += 1
        data = self.root / f"..v{self.version}"
        data.mkdir()
        (data / "tls.crt").write_bytes(cert)
        (data / "tls.key").write_bytes(key)
        staged = self.root / "..data_tmp"
        staged.symlink_to(data.name)
        os.replace(staged, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")


@dataclass
class Tls:
    ca: Authority
    volume: SecretVolume
    trust: ssl.SSLContext
    ca_file: Path


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    ca = Authority("test CA")
    volume = SecretVolume(tmp_path / "secret")
    volume.publish(*ca.issue(serial=1001))
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    return Tls(ca, volume, ssl.create_default_context(cafile=str(ca_file)), ca_file)


def issue_at(
    ca: Authority, serial: int, not_before: datetime.datetime, not_after: datetime.datetime
) -> tuple[bytes, bytes]:
    """A server certificate for 127.0.0.1 valid from `not_before` to `not_after`, and its
    key (PEM): the demo CA's `issue` makes only certificates valid now."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca.name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


DAY = datetime.timedelta(days=1)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def sidecar_config(store: processes.Proc, tmp: Path, tls: Tls | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "upstream": store.url,
        "policies": str(paths.ROOT / "policies"),
        "identity": {
            "tokenFile": str(processes.write_tokens(tmp, TOKENS)),
            "jwt": {"algorithms": ["HS256"], "secret": JWT_SECRET},
        },
    }
    if tls is not None:
        config["tls"] = {"certFile": str(tls.volume.cert_file), "keyFile": str(tls.volume.key_file)}
    return config


@pytest.fixture
def https_sidecar(store: processes.Proc, tmp_path: Path, tls: Tls) -> Iterator[processes.Proc]:
    proc = processes.start_sidecar(tmp_path, sidecar_config(store, tmp_path, tls), tls=tls.trust)
    try:
        tenant = json.dumps({"metadata": {"name": "acme"}}).encode()
        request = urllib.request.Request(
            f"https://127.0.0.1:{proc.port}/api/v1/tenants",
            data=tenant,
            headers={"Authorization": "Bearer t-admin", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10, context=tls.trust) as response:
            assert response.status == 201
        yield proc
    finally:
        proc.stop()


def get(port: int, path: str, trust: ssl.SSLContext, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=trust) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def served(port: int, tls: Tls) -> tuple[int, str | None]:
    """The serial of the certificate a new connection gets, and the ALPN protocol
    chosen from what kubectl offers."""
    context = ssl.create_default_context(cafile=str(tls.ca_file))
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            der = conn.getpeercert(binary_form=True)
            assert der is not None
            return x509.load_der_x509_certificate(der).serial_number, conn.selected_alpn_protocol()


def wait_for(predicate: Any, what: str, proc: processes.Proc, timeout: float = 20.0) -> None:
    try:
        eventually_sync(predicate, timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{proc.log()}") from None


def tls_check(port: int, trust: ssl.SSLContext) -> tuple[int, dict[str, Any]]:
    status, body = get(port, "/readyz", trust)
    return status, body["checks"]["tls"]


def test_https_with_the_right_ca_and_a_wrong_one(https_sidecar: processes.Proc, tls: Tls) -> None:
    port = https_sidecar.port
    status, body = get(port, "/api/v1/tenants", tls.trust, "t-admin")
    assert status == 200
    assert body["kind"] == "TenantList"
    status, body = get(port, "/api/v1/tenants", tls.trust)
    assert status == 401
    assert body["kind"] == "Status"
    assert served(port, tls) == (1001, "http/1.1")

    other = Authority("some other CA")
    wrong = ssl.create_default_context(cadata=other.cert_pem.decode())
    with pytest.raises(urllib.error.URLError) as caught:
        get(port, "/healthz", wrong)
    assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)

    assert server_context().minimum_version == ssl.TLSVersion.TLSv1_2

    # Plain HTTP on the TLS port gets no answer the client could mistake for one.
    with pytest.raises((ConnectionError, TimeoutError, urllib.error.URLError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_rotation_serves_the_new_certificate_and_a_broken_one_keeps_the_old(
    https_sidecar: processes.Proc, tls: Tls
) -> None:
    port = https_sidecar.port
    assert served(port, tls)[0] == 1001
    status, check = tls_check(port, tls.trust)
    assert status == 200
    assert check["ok"] is True

    tls.volume.publish(*tls.ca.issue(serial=1002))
    wait_for(lambda: served(port, tls)[0] == 1002, "rotation to 1002", https_sidecar)

    # A certificate that is not PEM, then a key that does not match: both refused.
    good_cert, good_key = tls.ca.issue(serial=1003)
    tls.volume.publish(b"not a certificate\n", good_key)
    wait_for(lambda: tls_check(port, tls.trust)[1]["ok"] is False, "readyz shows it", https_sidecar)
    _, other_key = tls.ca.issue(serial=1004)
    tls.volume.publish(good_cert, other_key)
    wait_for(lambda: "does not match" in https_sidecar.log(), "the mismatch logged", https_sidecar)
    status, check = tls_check(port, tls.trust)
    assert status == 200
    assert check["ok"] is False
    assert not check["required"]
    assert "/" not in check["detail"]  # no file path in /readyz
    assert served(port, tls)[0] == 1002
    assert get(port, "/api/v1/tenants", tls.trust, "t-admin")[0] == 200

    tls.volume.publish(good_cert, good_key)
    wait_for(lambda: served(port, tls)[0] == 1003, "rotation to 1003", https_sidecar)
    wait_for(lambda: tls_check(port, tls.trust)[1]["ok"] is True, "ready again", https_sidecar)
    # Logged once per change, not once per poll.
    assert https_sidecar.log().count("TLS certificate reload refused") == 2
    assert https_sidecar.proc.poll() is None


def test_an_expired_or_not_yet_valid_certificate_is_refused_on_reload(
    https_sidecar: processes.Proc, tls: Tls
) -> None:
    """DESIGN §4: a pair whose certificate is out of its validity is refused like a
    broken pair: the last good one keeps serving, /readyz says why and when the serving
    certificate expires (before: taken, every new handshake got an expired certificate,
    and /readyz said ok)."""
    port = https_sidecar.port
    assert served(port, tls)[0] == 1001
    serving_until = tls_check(port, tls.trust)[1]["detail"].rsplit("valid until ", 1)[1]

    tls.volume.publish(*issue_at(tls.ca, 2001, now() - 3 * DAY, now() - DAY))
    wait_for(lambda: tls_check(port, tls.trust)[1]["ok"] is False, "expired refused", https_sidecar)
    status, check = tls_check(port, tls.trust)
    assert status == 200
    assert "tls.certFile: the certificate expired" in check["detail"], check
    assert "serial 3e9" in check["detail"]  # 1001: the last good one, still serving
    assert f"valid until {serving_until}" in check["detail"]
    assert "/" not in check["detail"]
    assert served(port, tls)[0] == 1001
    assert get(port, "/api/v1/tenants", tls.trust, "t-admin")[0] == 200

    tls.volume.publish(*issue_at(tls.ca, 2002, now() + DAY, now() + 3 * DAY))
    wait_for(
        lambda: "is not valid before" in tls_check(port, tls.trust)[1]["detail"],
        "not yet valid refused",
        https_sidecar,
    )
    assert served(port, tls)[0] == 1001
    assert https_sidecar.log().count("TLS certificate reload refused") == 2

    tls.volume.publish(*issue_at(tls.ca, 2003, now() - DAY, now() + DAY))
    wait_for(lambda: served(port, tls)[0] == 2003, "rotation to 2003", https_sidecar)
    wait_for(lambda: tls_check(port, tls.trust)[1]["ok"] is True, "ready again", https_sidecar)


class FakeClock:
    def __init__(self) -> None:
        self.at = now()

    def __call__(self) -> datetime.datetime:
        return self.at


def test_a_certificate_refused_as_not_yet_valid_comes_into_force_when_valid(tls: Tls) -> None:
    """A clock a little behind the issuer's must not strand a fresh certificate until
    the next rotation: the refused pair is tried again once its time has come."""
    clock = FakeClock()
    reloader = TlsReloader(
        TlsConfig(cert_file=str(tls.volume.cert_file), key_file=str(tls.volume.key_file)),
        clock=clock,
    )
    tls.volume.publish(
        *issue_at(tls.ca, 3001, clock.at + datetime.timedelta(hours=1), clock.at + DAY)
    )
    assert reloader.check() is False
    assert [reloader.check() for _ in range(3)] == [False, False, False]
    assert reloader.current.serial == 1001
    ok, detail = reloader.ready()
    assert not ok
    assert "is not valid before" in detail
    clock.at += datetime.timedelta(hours=2)
    assert reloader.check() is True
    assert reloader.current.serial == 3001
    assert reloader.ready()[0] is True


def test_a_serving_certificate_that_expires_shows_in_readiness(tls: Tls) -> None:
    clock = FakeClock()
    reloader = TlsReloader(
        TlsConfig(cert_file=str(tls.volume.cert_file), key_file=str(tls.volume.key_file)),
        clock=clock,
    )
    ok, detail = reloader.ready()
    assert ok
    assert "valid until" in detail
    clock.at += 30 * DAY  # the demo CA issues for 7 days
    ok, detail = reloader.ready()
    assert not ok
    assert "serving certificate (serial 3e9) expired" in detail, detail
    assert reloader.current.serial == 1001  # nothing better to serve


def test_each_change_is_loaded_or_logged_once(tls: Tls, caplog: pytest.LogCaptureFixture) -> None:
    """The poll step itself: nothing changed is nothing done; a broken pair is refused
    and logged once however often it is polled; the next good pair comes into force."""
    reloader = TlsReloader(
        TlsConfig(cert_file=str(tls.volume.cert_file), key_file=str(tls.volume.key_file))
    )
    assert reloader.check() is False
    assert reloader.current.serial == 1001
    good_cert, good_key = tls.ca.issue(serial=1002)
    tls.volume.publish(good_cert, tls.ca.issue()[1])
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        assert [reloader.check() for _ in range(3)] == [False, False, False]
    assert [r.getMessage().count("does not match") for r in caplog.records] == [1]
    assert reloader.current.serial == 1001
    ok, detail = reloader.ready()
    assert not ok
    assert str(tls.volume.root) not in detail
    tls.volume.publish(good_cert, good_key)
    assert reloader.check() is True
    assert reloader.current.serial == 1002
    assert reloader.ready()[0] is True


def test_metrics_listen_stays_plain_http(store: processes.Proc, tmp_path: Path, tls: Tls) -> None:
    config = sidecar_config(store, tmp_path, tls)
    proc = processes.start_sidecar(tmp_path, config, metrics=True, tls=tls.trust)
    metrics_port = proc.extra["metrics_port"]
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics", timeout=10
        ) as response:
            assert response.status == 200
            assert b"sidecar_" in response.read()
    finally:
        proc.stop()


def test_a_stalled_handshake_is_dropped(store: processes.Proc, tmp_path: Path, tls: Tls) -> None:
    config = sidecar_config(store, tmp_path, tls)
    config["limits"] = {"headerTimeout": 1}
    proc = processes.start_sidecar(tmp_path, config, tls=tls.trust)
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=30) as raw:
            started = time.monotonic()
            assert raw.recv(1) == b""  # closed by the sidecar, not by our timeout
            # Well under asyncio's default 60 s handshake allowance.
            assert time.monotonic() - started < 30
        assert get(proc.port, "/healthz", tls.trust) == (200, {"status": "ok"})
    finally:
        proc.stop()


def _serve(tmp: Path, config: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    path = processes.write_config(tmp, {**config, "listen": f"127.0.0.1:{processes.free_port()}"})
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path), *extra],
        cwd=str(paths.ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_a_missing_or_bad_file_at_startup_is_one_line_naming_the_key(
    store: processes.Proc, tmp_path: Path, tls: Tls, workers: int
) -> None:
    config = sidecar_config(store, tmp_path, tls)
    cert, key = str(tls.volume.cert_file), str(tls.volume.key_file)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN NOTHING-----\n")
    _, other_key = tls.ca.issue()
    mismatched = tmp_path / "other.key"
    mismatched.write_bytes(other_key)
    expired_cert, expired_key = tmp_path / "expired.crt", tmp_path / "expired.key"
    for path, pem in zip(
        (expired_cert, expired_key), issue_at(tls.ca, 9, now() - 3 * DAY, now() - DAY), strict=True
    ):
        path.write_bytes(pem)
    early_cert, early_key = tmp_path / "early.crt", tmp_path / "early.key"
    for path, pem in zip(
        (early_cert, early_key), issue_at(tls.ca, 10, now() + DAY, now() + 3 * DAY), strict=True
    ):
        path.write_bytes(pem)
    cases = [
        ({"certFile": str(tmp_path / "absent.crt"), "keyFile": key}, "tls.certFile"),
        ({"certFile": cert, "keyFile": str(tmp_path / "absent.key")}, "tls.keyFile"),
        ({"certFile": str(garbage), "keyFile": key}, "tls.certFile"),
        ({"certFile": cert, "keyFile": str(garbage)}, "tls.keyFile"),
        ({"certFile": cert, "keyFile": str(mismatched)}, "tls.keyFile"),
        ({"certFile": cert}, "tls.keyFile"),
        ({"certFile": str(expired_cert), "keyFile": str(expired_key)}, "tls.certFile"),
        ({"certFile": str(early_cert), "keyFile": str(early_key)}, "tls.certFile"),
    ]
    for files, named in cases:
        result = _serve(tmp_path, {**config, "tls": files}, "--workers", str(workers))
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (
            files,
            result.stderr,
        )
        assert named in lines[0], (
            files,
            result.stderr,
        )
        assert "Traceback" not in result.stderr, (
            files,
            result.stderr,
        )


def _probe(listen: str) -> int:
    env = {**os.environ, "SIDECAR_LISTEN": listen}
    return subprocess.run(
        [sys.executable, "-m", "sidecar.edge.tls"], cwd=str(paths.ROOT), env=env, timeout=30
    ).returncode


def test_the_container_health_probe_speaks_https_and_http(
    https_sidecar: processes.Proc, store: processes.Proc, tmp_path: Path
) -> None:
    assert _probe(f"0.0.0.0:{https_sidecar.port}") == 0
    plain = processes.start_sidecar(tmp_path, sidecar_config(store, tmp_path, None), name="plain")
    try:
        assert _probe(f"0.0.0.0:{plain.port}") == 0
    finally:
        plain.stop()
    assert _probe(f"127.0.0.1:{processes.free_port()}") == 1


# -- kubectl through a kubeconfig --------------------------------------------------------


def run_kubectl(tmp: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = kubectl_binary()
    return subprocess.run(
        [binary, "--kubeconfig", str(config), "--cache-dir", str(tmp / "kcache"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp)},
        timeout=60,
    )


def write_kubeconfig(tmp: Path, port: int, ca_pem: bytes, token: str, name: str) -> Path:
    path = tmp / f"{name}.kubeconfig"
    path.write_text(kubeconfig(f"https://127.0.0.1:{port}", ca_pem, name, token, "default"))
    return path


def test_kubectl_with_a_wrong_ca_is_a_tls_error(
    https_sidecar: processes.Proc, tls: Tls, tmp_path: Path
) -> None:
    port = https_sidecar.port
    good = write_kubeconfig(tmp_path, port, tls.ca.cert_pem, "t-alice", "good")
    result = run_kubectl(tmp_path, good, "get", "--raw", "/api/v1/namespaces/default/configmaps")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kind"] == "ConfigMapList"

    wrong = write_kubeconfig(tmp_path, port, Authority("other CA").cert_pem, "t-alice", "wrong")
    result = run_kubectl(tmp_path, wrong, "get", "--raw", "/api/v1/namespaces/default/configmaps")
    assert result.returncode != 0
    assert "certificate signed by unknown authority" in result.stderr, result.stderr


def test_an_expired_jwt_in_a_kubeconfig_is_a_401_status(
    https_sidecar: processes.Proc, tls: Tls, tmp_path: Path
) -> None:
    port = https_sidecar.port
    now = int(time.time())
    claims = {"sub": "alice", "tenant": "acme", "groups": ["tenant-admins"]}
    fresh = jwt.encode({**claims, "exp": now + 600}, JWT_SECRET, algorithm="HS256")
    expired = jwt.encode({**claims, "exp": now - 600}, JWT_SECRET, algorithm="HS256")

    config = write_kubeconfig(tmp_path, port, tls.ca.cert_pem, fresh, "fresh")
    result = run_kubectl(tmp_path, config, "get", "configmaps", "-o", "name")
    assert result.returncode == 0, result.stderr

    config = write_kubeconfig(tmp_path, port, tls.ca.cert_pem, expired, "expired")
    result = run_kubectl(tmp_path, config, "get", "--raw", "/api/v1/namespaces/default/configmaps")
    assert result.returncode != 0
    # kubectl read the 401 Status: its wording for a 401, the Status's message.
    assert "You must be logged in to the server" in result.stderr, result.stderr
    assert "expired" in result.stderr
    status, body = get(port, "/api/v1/namespaces/default/configmaps", tls.trust, expired)
    assert status == 401
    assert body["kind"] == "Status"
    assert body["reason"] == "Unauthorized"
    assert "expired" in body["message"]
