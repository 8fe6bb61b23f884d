"""`sidecar config envoy|nginx` (DESIGN §13): what the generated configs promise. They
run for real in tests/system/test_decision_service.py; here, the settings a change
could lose."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli.main import main


def _envoy(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code = main(
        [
            "config",
            "envoy",
            "--listen",
            "127.0.0.1:10000",
            "--upstream",
            "http://127.0.0.1:8080",
            "--authz",
            "127.0.0.1:9191",
            "--proxy",
            "http://127.0.0.1:8443",
            *extra,
        ]
    )
    assert code == 0
    return dict(json.loads(capsys.readouterr().out))


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    listener = config["static_resources"]["listeners"][0]
    return dict(listener["filter_chains"][0]["filters"][0]["typed_config"])


def test_envoy_refuses_when_the_decider_fails_and_reads_the_path_unchanged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hcm = _hcm(_envoy(capsys))
    authz = hcm["http_filters"][0]["typed_config"]
    assert authz["failure_mode_allow"] is False
    assert authz["status_on_error"] == {"code": "ServiceUnavailable"}
    assert authz["clear_route_cache"] is True
    assert authz["http_service"]["path_prefix"] == "/envoy"
    assert hcm["normalize_path"] is False
    assert hcm["merge_slashes"] is False
    assert hcm["common_http_protocol_options"]["headers_with_underscores_action"] == "DROP_HEADER"
    healthz, direct, proxy = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert healthz["match"] == {"path": "/healthz"}
    assert direct["route"]["cluster"] == "upstream"
    assert {"x-sidecar-route", "x-sidecar-decided"} <= set(direct["request_headers_to_remove"])
    assert "authorization" not in direct["request_headers_to_remove"]
    assert proxy["route"]["cluster"] == "sidecar_proxy"
    assert {"x-remote-user", "x-remote-tenant", "x-remote-group"} <= set(
        proxy["request_headers_to_remove"]
    )


def test_envoy_follows_the_sidecars_identity_settings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text("identity: {forwardAuthorization: false, stripHeaders: [X-Api-User]}\n")
    hcm = _hcm(_envoy(capsys, "--config", str(config)))
    asked = hcm["http_filters"][0]["typed_config"]["allowed_headers"]["patterns"]
    assert {"exact": "x-api-user"} in asked
    assert {"prefix": "impersonate-"} in asked
    direct = hcm["route_config"]["virtual_hosts"][0]["routes"][1]
    assert "authorization" in direct["request_headers_to_remove"]


def test_envoy_grpc(capsys: pytest.CaptureFixture[str]) -> None:
    config = _envoy(capsys, "--grpc", "127.0.0.1:9192")
    authz = _hcm(config)["http_filters"][0]["typed_config"]
    assert authz["grpc_service"]["envoy_grpc"]["cluster_name"] == "sidecar_authz_grpc"
    names = [c["name"] for c in config["static_resources"]["clusters"]]
    assert "sidecar_authz_grpc" in names


def test_nginx(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text("identity: {forwardAuthorization: false}\n")
    args = ["--listen", "127.0.0.1:8000", "--upstream", "http://127.0.0.1:8080"]
    args += ["--authz", "127.0.0.1:9191", "--proxy", "http://127.0.0.1:8443"]
    assert main(["config", "nginx", *args, "--prefix", "/srv/front", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "nginx -p /srv/front -c nginx.conf" in text
    assert "proxy_pass_request_body off;" in text
    assert "proxy_set_header X-Original-URI $request_uri;" in text
    assert "error_page 401 403 = @denied;" in text
    assert "error_page 500 = @unavailable;" in text
    assert 'direct "";' in text  # no Authorization upstream on the direct route
    assert "/var/" not in text  # every path relative to the prefix


def test_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--listen", "nowhere", "--upstream", "http://127.0.0.1:8080"]
    args += ["--authz", "127.0.0.1:9191", "--proxy", "http://127.0.0.1:8443"]
    assert main(["config", "envoy", *args]) == 2
    assert "--listen" in capsys.readouterr().err
