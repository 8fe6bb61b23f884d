"""Redaction: what may leave the process in logs, `/readyz` details and error bodies.

DESIGN §9: passwords in URLs never appear in logs, `/readyz` or error bodies, and
`/readyz` never names a file path. Every URL (Redis tiers, the ledger, the upstream)
that is shown anywhere goes through `redact_url`; free text that may quote one (an
exception message) goes through `redact_text`; `/readyz` details go through
`public_detail`, which also drops file paths.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# scheme://userinfo@ — the userinfo is whatever precedes the last '@' of the authority.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#@]*)@")
# A path-like token: starts with '/', '~/', './' or '../' and is not inside a word or
# a network URL (`host:6379/0`, `I/O`, `redis://` stay); `sqlite:///…` is a path.
_PATH = re.compile(
    r"(?:(?<=sqlite://)|(?<=file://)|(?<![\w:/.~\-]))(?:~|\.{1,2})?/[^\s;,'\"()\[\]{}<>]+"
)


def redact_url(url: str) -> str:
    """The URL with its password masked (`redis://:***@host:6379/0`)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return redact_text(url)
    if password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port:
        host = f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{MASK}@{host}"))


def redact_text(text: str) -> str:
    """Free text with the userinfo of every URL in it masked (keeping a user name)."""

    def mask(match: re.Match[str]) -> str:
        user, sep, _password = match["userinfo"].partition(":")
        if not sep:
            return match[0]  # a user name only, no password
        return f"{match['scheme']}{user}:{MASK}@"

    return _USERINFO.sub(mask, text)


def public_detail(text: str) -> str:
    """A `/readyz` detail: no password and no file path (each path becomes `<path>`)."""

    def path(match: re.Match[str]) -> str:
        found = match[0]
        tail = len(found) - len(found.rstrip(":."))
        return "<path>" + found[len(found) - tail :] if tail else "<path>"

    return _PATH.sub(path, redact_text(text))


def policy_file_names(text: str) -> str:
    """An explanation for a caller: each file path becomes its file name (`10-admin.yaml:11`
    stays readable; where the server keeps its policy directory is not the caller's)."""

    def name(match: re.Match[str]) -> str:
        found = match[0]
        return found.rsplit("/", 1)[-1] or found

    return _PATH.sub(name, text)
