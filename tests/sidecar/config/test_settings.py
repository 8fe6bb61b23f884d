"""Config: defaults, YAML file, SIDECAR_ environment overrides, errors naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config.settings import ConfigError, config_to_dict, load_config


def test_defaults_run_out_of_the_box() -> None:
    config = load_config(None, env={})
    assert config.listen == "127.0.0.1:8443"
    assert config.upstream == "http://127.0.0.1:8080"
    assert config.policies == "./policies"
    assert config.ledger == "sqlite:///./.sidecar/ledger.db"
    assert config.mode == "enforce"
    assert config.conceal_other_tenants is True
    assert config.limits.max_body_bytes == 3145728
    assert config.identity.jwt.claims.tenant == "tenant"
    assert config.rate_limit.global_ is None
    assert config.audit.path == "-"
    assert config.metrics_listen is None  # /metrics only on the main listener, authorized
    assert config.identity.jwt.require_exp is True


def test_yaml_file_and_nested_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "listen: 0.0.0.0:9000\nupstream: unix:/run/api.sock\nmode: dry-run\n"
        "identity: {tokenFile: /t.yaml, jwt: {algorithms: [RS256], issuer: me,"
        " claims: {tenant: org}}}\n"
        "rateLimit: {global: redis://127.0.0.1:6379/1}\n"
        "quota: {reservationTtlSeconds: 30}\n"
    )
    config = load_config(path, env={})
    assert config.listen_host_port == ("0.0.0.0", 9000)
    assert config.upstream == "unix:/run/api.sock"
    assert config.mode == "dry-run"
    assert config.identity.token_file == "/t.yaml"
    assert config.identity.jwt.algorithms == ["RS256"]
    assert config.identity.jwt.claims.tenant == "org"
    assert config.identity.jwt.claims.user == "sub"
    assert config.rate_limit.global_ == "redis://127.0.0.1:6379/1"
    assert config.quota.reservation_ttl_seconds == 30.0
    assert config_to_dict(config)["rateLimit"]["global"] == "redis://127.0.0.1:6379/1"


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("identity: {tokenFile: /from-file.yaml}\n")
    env = {
        "SIDECAR_IDENTITY__TOKEN_FILE": "/from-env.yaml",
        "SIDECAR_CONCEAL_OTHER_TENANTS": "false",
        "SIDECAR_LIMITS__MAX_BODY_BYTES": "1024",
        "SIDECAR_IDENTITY__JWT__ALGORITHMS": "[ES256, RS256]",
        "SIDECAR_RATE_LIMIT__GLOBAL": "redis://x:6379/0",
        "UNRELATED": "ignored",
    }
    config = load_config(path, env=env)
    assert config.identity.token_file == "/from-env.yaml"
    assert config.conceal_other_tenants is False
    assert config.limits.max_body_bytes == 1024
    assert config.identity.jwt.algorithms == ["ES256", "RS256"]
    assert config.rate_limit.global_ == "redis://x:6379/0"


@pytest.mark.parametrize(
    ("text", "env", "fragment"),
    [
        ("listne: 1.2.3.4:5\n", {}, "'listne'"),
        ("identity: {tokenFiel: x}\n", {}, "'identity.tokenFiel'"),
        ("limits: {maxBodyBytes: lots}\n", {}, "'limits.maxBodyBytes' must be an integer"),
        ("concealOtherTenants: maybe\n", {}, "'concealOtherTenants' must be true or false"),
        ("mode: strict\n", {}, "'mode' must be one of"),
        ("identity: {jwt: {algorithms: HS256}}\n", {}, "'identity.jwt.algorithms' must be a list"),
        ("identity: 5\n", {}, "'identity' must be a mapping"),
        ("- a\n- b\n", {}, "mapping at the top level"),
        ("listen: nonsense\n", {}, "'listen' must be HOST:PORT"),
        ("upstream: ftp://x\n", {}, "'upstream'"),
        ("ledger: mysql://x\n", {}, "'ledger'"),
        ("", {"SIDECAR_NOPE": "1"}, "'NOPE'"),
        ("", {"SIDECAR_LIMITS__NOPE": "1"}, "'LIMITS.NOPE'"),
        ("", {"SIDECAR_LIMITS__MAX_BODY_BYTES": "big"}, "'limits.maxBodyBytes'"),
        ("listen: [unclosed\n", {}, "not valid YAML"),
        ("metricsListen: 9090\n", {}, "'metricsListen' must be HOST:PORT"),
        ("metricsListen: 'host:0'\n", {}, "'metricsListen' must be HOST:PORT"),
        ("identity: {jwt: {requireExp: sometimes}}\n", {}, "'identity.jwt.requireExp'"),
        ("eventLoop: trio\n", {}, "'eventLoop'"),
        ("identity: {stripHeaders: X-User}\n", {}, "'identity.stripHeaders' must be a list"),
        ("identity: {stripHeaders: ['X User']}\n", {}, "'identity.stripHeaders[0]' is not a"),
        ("identity: {stripHeaders: [X-A, Content_Length]}\n", {}, "'identity.stripHeaders[1]'"),
        ("quota: {settleAfterSeconds: -1}\n", {}, "'quota.settleAfterSeconds' must be between"),
        ("quota: {settleAfterSeconds: .nan}\n", {}, "'quota.settleAfterSeconds' must be between"),
        (
            "quota: {reservationTtlSeconds: 60, settleAfterSeconds: 61}\n",
            {},
            "'quota.settleAfterSeconds' must be between 0 and 'quota.reservationTtlSeconds'",
        ),
    ],
)
def test_bad_config_names_the_key(
    tmp_path: Path, text: str, env: dict[str, str], fragment: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env)
    assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml", env={})


def test_serve_refuses_bad_config_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("limits: {maxBodyBytes: -}\n")
    result = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "limits.maxBodyBytes" in result.stderr


def test_serve_config_errors_are_one_line(tmp_path: Path) -> None:
    """A YAML error spans several lines; the operator gets it as one."""
    path = tmp_path / "c.yaml"
    path.write_text("listen: [unclosed\n")
    result = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_event_loop_choice() -> None:
    import asyncio

    import uvloop

    from sidecar.cli.main import _loop_runner

    assert _loop_runner("auto") is uvloop.run  # uvloop is a dependency where it exists
    assert _loop_runner("uvloop") is uvloop.run
    assert _loop_runner("asyncio") is asyncio.run


def test_strip_headers_are_compared_without_case_and_with_underscores_as_dashes() -> None:
    assert load_config(None, env={}).identity.strip_header_names == frozenset()
    config = load_config(None, env={"SIDECAR_IDENTITY__STRIP_HEADERS": "[X-Auth-User, x_email]"})
    assert config.identity.strip_headers == ["X-Auth-User", "x_email"]
    assert config.identity.strip_header_names == {"x-auth-user", "x-email"}


def test_a_yaml_error_never_quotes_the_line(tmp_path: Path) -> None:
    """PyYAML's message quotes the offending line, which may hold the JWT secret."""
    path = tmp_path / "sidecar.yaml"
    path.write_text('identity:\n  jwt: {secret: "topsecret-value", algorithms: [HS256\n')
    with pytest.raises(ConfigError) as err:
        load_config(path=str(path), env={})
    assert "not valid YAML: line 3" in str(err.value)
    assert "topsecret" not in str(err.value)
