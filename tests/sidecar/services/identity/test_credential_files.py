"""Empty credential files (DESIGN §4): a token file, JWT public key or JWKS file that is
empty (0 bytes, or only whitespace, as a half-written file is) fails to load like a
broken one: at start-up it stops the start with a message naming the key, on reload
the last good credentials stay in force and `/readyz` and the log say why. An explicit
empty list `[]` is a token file with no static tokens.

The loaders are tested directly, the reload against a real `sidecar serve` process in
front of the real backing store."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jwt
import pytest

from sidecar.config.settings import ConfigError, JwtConfig
from sidecar.services.identity.files import CredentialFileError
from sidecar.services.identity.keys import load_jwt_keys
from sidecar.services.identity.tokens import load_token_file
from tests.rigs import processes
from tests.rigs.inprocess import write_policy
from tests.rigs.tokens import claims, public_pem, rsa_key
from tests.rigs.waiting import eventually_sync

EMPTY = ["", " ", "\n", "  \n\t\n  \r\n"]
ROOT = {"token": "token-a", "user": "root", "tenant": "system", "groups": ["operators"]}
# A token file holds secrets: no message about it may quote one.
SECRET_TOKEN = "a-secret-token-value"


@pytest.mark.parametrize("text", EMPTY)
def test_an_empty_token_file_is_refused_naming_the_key(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(CredentialFileError) as caught:
        load_token_file(str(path))
    assert isinstance(caught.value, ConfigError)
    assert str(caught.value).startswith("identity.tokenFile: ")
    assert "empty" in str(caught.value)
    assert caught.value.public == (
        "identity.tokenFile: the file is empty (0 bytes or only whitespace); "
        "write [] for no static tokens"
    )


@pytest.mark.parametrize("text", ["# no tokens yet\n", "null\n", "~\n", "---\n"])
def test_a_token_file_without_a_list_is_refused(tmp_path: Path, text: str) -> None:
    """Comments only, or a YAML null: not the explicit `[]`, so not "no tokens"."""
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(CredentialFileError, match=r"identity\.tokenFile"):
        load_token_file(str(path))


@pytest.mark.parametrize("text", ["[]", "[]\n", "  []  \n", "# none\n[]\n"])
def test_an_explicit_empty_list_means_no_static_tokens(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    assert load_token_file(str(path)) == {}


def test_a_yaml_error_never_quotes_the_file(tmp_path: Path) -> None:
    """PyYAML's message quotes the offending line, which in a token file is a token."""
    path = tmp_path / "tokens.yaml"
    path.write_text(f"- token: {SECRET_TOKEN}: x\n  user: u\n")
    with pytest.raises(CredentialFileError) as caught:
        load_token_file(str(path))
    assert "not valid YAML" in str(caught.value)
    assert "line 1" in str(caught.value)
    assert SECRET_TOKEN not in str(caught.value)
    assert SECRET_TOKEN not in caught.value.public


@pytest.mark.parametrize("text", EMPTY)
@pytest.mark.parametrize("which", ["publicKeyFile", "jwksFile"])
def test_an_empty_key_file_is_refused_naming_the_key(tmp_path: Path, text: str, which: str) -> None:
    path = tmp_path / "key"
    path.write_text(text)
    settings: dict[str, Any] = {"algorithms": ["RS256"]}
    settings["public_key_file" if which == "publicKeyFile" else "jwks_file"] = str(path)
    with pytest.raises(CredentialFileError) as caught:
        load_jwt_keys(JwtConfig(**settings))
    assert str(caught.value).startswith(f"identity.jwt.{which}: ")
    assert "empty" in caught.value.public


# -- a real sidecar process ---------------------------------------------------------


def call(url: str, path: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def credentials_check(url: str) -> dict[str, Any]:
    status, body = call(url, "/readyz")
    assert status == 200, body  # a credential file never makes the sidecar unready
    check: dict[str, Any] = body["checks"]["credentials"]
    assert check["required"] is False
    return check


def wait_log(proc: processes.Proc, text: str, count: int) -> None:
    """Until `text` appears `count` times in the process's log."""
    try:
        eventually_sync(lambda: proc.log().count(text) >= count, 15, what=f"{count}x {text!r}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{proc.log()}") from None


def start(procs: processes.Processes, tmp: Path, identity: dict[str, Any]) -> processes.Proc:
    store = procs.store()
    return procs.sidecar(
        {
            "upstream": store.url,
            "policies": str(write_policy(tmp)),
            "identity": identity,
            # Failed authentications cost the address tokens; these tests send a few.
            "rateLimit": {"anonymous": {"rate": 1000, "burst": 1000}},
        }
    )


def test_an_empty_token_file_on_reload_keeps_the_last_good_tokens(
    procs: processes.Processes, tmp_path: Path
) -> None:
    """The issue's case: a token file rewritten empty was taken as "no tokens" (every
    static-token user got 401, then their address 429) while /readyz said all is well."""
    tokens = processes.write_tokens(tmp_path, [ROOT, {**ROOT, "token": SECRET_TOKEN}])
    sidecar = start(procs, tmp_path, {"tokenFile": str(tokens)})
    url, path = sidecar.url, "/api/v1/tenants"
    assert call(url, path, "token-a")[0] == 200
    assert credentials_check(url)["ok"] is True

    refused = "credential reload refused"
    for n, text in enumerate(["", "  \n\t\n"], start=1):
        tokens.write_text(text)
        wait_log(sidecar, refused, n)
        check = credentials_check(url)
        assert check["ok"] is False, check
        assert "identity.tokenFile: the file is empty" in check["detail"]
        assert "last good credentials" in check["detail"]
        assert str(tmp_path) not in check["detail"]
        assert call(url, path, "token-a")[0] == 200  # the last good tokens stay
    assert "empty" in sidecar.log().split(refused, 1)[1].splitlines()[0]

    # A good file again: in force, ready again.
    processes.write_tokens(tmp_path, [{**ROOT, "token": "token-b"}])
    wait_log(sidecar, "credentials reloaded", 1)
    assert credentials_check(url)["ok"] is True
    assert call(url, path, "token-b")[0] == 200
    assert call(url, path, "token-a")[0] == 401

    # `[]`: no static tokens, and that is a good file.
    tokens.write_text("[]\n")
    wait_log(sidecar, "credentials reloaded", 2)
    assert credentials_check(url)["ok"] is True
    status, body = call(url, path, "token-b")
    assert status == 401, body
    assert SECRET_TOKEN not in sidecar.log()


def test_an_empty_key_file_on_reload_keeps_the_last_good_key(
    procs: processes.Processes, tmp_path: Path
) -> None:
    key = rsa_key()
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(public_pem(key))
    sidecar = start(
        procs,
        tmp_path,
        {"jwt": {"algorithms": ["RS256"], "publicKeyFile": str(pem), "audience": "sidecar"}},
    )
    token = jwt.encode(claims("root", "system", ["operators"], iss=None), key, algorithm="RS256")
    url, path = sidecar.url, "/api/v1/tenants"
    assert call(url, path, token)[0] == 200
    pem.write_text("\n\n")
    wait_log(sidecar, "credential reload refused", 1)
    check = credentials_check(url)
    assert check["ok"] is False
    assert "identity.jwt.publicKeyFile: the file is empty" in check["detail"]
    assert call(url, path, token)[0] == 200


def test_a_sidecar_starts_with_an_explicit_empty_token_list(
    procs: processes.Processes, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("[]\n")
    sidecar = start(procs, tmp_path, {"tokenFile": str(tokens)})
    assert credentials_check(sidecar.url)["ok"] is True
    assert call(sidecar.url, "/api/v1/tenants", "token-a")[0] == 401
