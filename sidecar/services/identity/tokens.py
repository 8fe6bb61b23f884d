"""The static token file (DESIGN §4, for development): a YAML list of
`{token, user, tenant, groups}`, looked up by the SHA-256 of the bearer token.

Only a list loads: an empty file, or one with no YAML document at all (comments only,
`null`), is refused like a broken one (sidecar/services/identity/files.py); `[]` is the way to
say "no static tokens". No message about the file ever quotes it (it holds tokens):
a YAML error names the line and column, not the text there."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import yaml
from aiohttp import web

from sidecar.core.identity import Identity
from sidecar.core.redact import yaml_problem
from sidecar.core.target import is_dns1123_label
from sidecar.services.identity.files import CredentialFileError, read_credential_file
from sidecar.services.identity.names import BEARER, STATIC, printable

KEY = "identity.tokenFile"
_NO_LIST = "expected a list of {token, user, tenant, groups}; write [] for no static tokens"


def load_token_file(path: str) -> dict[bytes, Identity]:
    """The YAML list `[{token, user, tenant, groups}]`, keyed by sha256(token).
    Raises CredentialFileError naming the key, the file and the problem."""

    def fault(problem: str, public: str | None = None) -> CredentialFileError:
        return CredentialFileError(KEY, path, problem, public)

    raw = read_credential_file(KEY, path, "; write [] for no static tokens")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise fault("not UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        raise fault(f"not valid YAML: {yaml_problem(exc)}") from None
    except yaml.YAMLError:
        raise fault("not valid YAML") from None
    if not isinstance(data, list):
        raise fault(_NO_LIST)
    tokens: dict[bytes, Identity] = {}
    for i, entry in enumerate(data):
        item = f"entry {i + 1}"
        if not isinstance(entry, dict):
            raise fault(f"{item} is not a mapping")
        unknown = set(entry) - {"token", "user", "tenant", "groups"}
        if unknown:
            raise fault(
                f"{item} has unknown keys {sorted(map(str, unknown))}",
                f"{item} has unknown keys (the keys are token, user, tenant, groups)",
            )
        token, user, tenant = entry.get("token"), entry.get("user"), entry.get("tenant")
        groups = entry.get("groups") or []
        if not isinstance(token, str) or not BEARER.match(token):
            raise fault(f"{item}: token must be a non-empty bearer token string")
        if not isinstance(user, str) or not printable(user):
            raise fault(f"{item}: user must be a non-empty string without control characters")
        if not isinstance(tenant, str) or not is_dns1123_label(tenant):
            # /readyz names no tenant (DESIGN §9); the log and start-up do.
            raise fault(
                f"{item}: tenant {tenant!r} is not a DNS-1123 label",
                f"{item}: tenant is not a DNS-1123 label",
            )
        if not isinstance(groups, list) or not all(
            isinstance(g, str) and printable(g) for g in groups
        ):
            raise fault(f"{item}: groups must be a list of strings")
        digest = hashlib.sha256(token.encode()).digest()
        if digest in tokens:
            raise fault(f"{item}: the same token appears twice")
        tokens[digest] = Identity(user, tenant, tuple(groups), STATIC)
    return tokens


class StaticTokenAuthenticator:
    name = STATIC

    def __init__(self, tokens: Mapping[bytes, Identity]) -> None:
        self.tokens = dict(tokens)

    def authenticate(self, request: web.Request, bearer: str | None) -> Identity | None:
        if bearer is None:
            return None
        return self.tokens.get(hashlib.sha256(bearer.encode()).digest())
