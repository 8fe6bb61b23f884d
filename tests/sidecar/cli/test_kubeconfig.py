"""`sidecar kubeconfig` (sidecar/cli/kubeconfig.py): an operator's contexts per tenant,
and the `as-user-extra` form that impersonates a tenant's user."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.cli.kubeconfig import KubeconfigError, build
from sidecar.cli.main import main


def test_one_context_per_tenant_with_the_tenant_server_url(tmp_path: Path) -> None:
    token = tmp_path / "token"
    doc = build("https://h:8443/", str(token), ["acme", "beta"], ca_file=str(tmp_path / "ca"))
    servers = {c["name"]: c["cluster"]["server"] for c in doc["clusters"]}
    assert servers == {"acme": "https://h:8443/tenants/acme", "beta": "https://h:8443/tenants/beta"}
    assert [c["name"] for c in doc["contexts"]] == ["acme", "beta"]
    assert doc["current-context"] == "acme"
    assert doc["users"] == [{"name": "operator", "user": {"tokenFile": str(token.resolve())}}]
    assert all(
        c["cluster"]["certificate-authority"] == str(tmp_path / "ca") for c in doc["clusters"]
    )


def test_impersonating_a_tenants_user_uses_as_user_extra(tmp_path: Path) -> None:
    doc = build("https://h", str(tmp_path / "t"), [], as_user="alice", as_tenant="acme")
    users = {u["name"]: u["user"] for u in doc["users"]}
    assert users["alice@acme"]["as"] == "alice"
    assert users["alice@acme"]["as-user-extra"] == {"tenant": ["acme"]}
    contexts = {c["name"]: c["context"] for c in doc["contexts"]}
    assert contexts["alice@acme"] == {"cluster": "sidecar", "user": "alice@acme"}
    assert contexts["sidecar"]["user"] == "operator"


@pytest.mark.parametrize(
    ("server", "tenants", "extra", "says"),
    [
        ("h:8443", [], {}, r"http\(s\) URL"),
        ("https://h/tenants/acme", [], {}, "name tenants with --tenant"),
        ("https://h", ["Acme"], {}, "not a tenant name"),
        ("https://h", ["acme", "acme"], {}, "once"),
        ("https://h", [], {"as_user": "alice"}, "go together"),
        ("https://h", [], {"as_user": "alice", "as_tenant": "a_b"}, "not a tenant name"),
    ],
)
def test_bad_arguments_say_what_to_change(
    server: str, tenants: list[str], extra: dict[str, Any], says: str
) -> None:
    with pytest.raises(KubeconfigError, match=says):
        build(server, "t", tenants, **extra)


def test_the_command_writes_a_private_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ops.kubeconfig"
    args = ["kubeconfig", "--server", "https://h", "--token-file", "t", "--tenant", "acme"]
    assert main([*args, "-o", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o600
    assert yaml.safe_load(out.read_text())["contexts"][0]["name"] == "acme"
    assert main(["kubeconfig", "--server", "nope", "--token-file", "t"]) == 2
    assert "http(s) URL" in capsys.readouterr().err
