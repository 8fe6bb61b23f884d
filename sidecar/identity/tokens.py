"""The static token file (DESIGN §4, for development): a YAML list of
`{token, user, tenant, groups}`, looked up by the SHA-256 of the bearer token."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import yaml
from aiohttp import web

from sidecar.config import ConfigError
from sidecar.context import Identity
from sidecar.identity.names import BEARER, STATIC, printable
from sidecar.target import is_dns1123_label


def load_token_file(path: str) -> dict[bytes, Identity]:
    """The YAML list `[{token, user, tenant, groups}]`, keyed by sha256(token)."""
    where = f"identity.tokenFile: {path}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if data is None:
        data = []
    if not isinstance(data, list):
        raise ConfigError(f"{where}: expected a list of {{token, user, tenant, groups}}")
    tokens: dict[bytes, Identity] = {}
    for i, entry in enumerate(data):
        item = f"{where}: entry {i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{item} is not a mapping")
        unknown = set(entry) - {"token", "user", "tenant", "groups"}
        if unknown:
            raise ConfigError(f"{item} has unknown keys {sorted(map(str, unknown))}")
        token, user, tenant = entry.get("token"), entry.get("user"), entry.get("tenant")
        groups = entry.get("groups") or []
        if not isinstance(token, str) or not BEARER.match(token):
            raise ConfigError(f"{item}: token must be a non-empty bearer token string")
        if not isinstance(user, str) or not printable(user):
            raise ConfigError(f"{item}: user must be a non-empty string without control characters")
        if not isinstance(tenant, str) or not is_dns1123_label(tenant):
            raise ConfigError(f"{item}: tenant {tenant!r} is not a DNS-1123 label")
        if not isinstance(groups, list) or not all(
            isinstance(g, str) and printable(g) for g in groups
        ):
            raise ConfigError(f"{item}: groups must be a list of strings")
        digest = hashlib.sha256(token.encode()).digest()
        if digest in tokens:
            raise ConfigError(f"{item}: the same token appears twice")
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
