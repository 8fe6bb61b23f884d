"""Redaction: what may leave the process in logs, `/readyz` details and error bodies.

DESIGN §9: passwords in URLs and tokens never appear in logs, `/readyz` or error
bodies, and `/readyz` never names a file path. Every URL (Redis tiers, the ledger, the
upstream) that is shown anywhere goes through `redact_url`; free text that may quote
one or a credential (an exception message, a parser's complaint about a header) goes
through `redact_text`; `/readyz` details go through `public_detail`, which also drops
file paths. An upstream's error answer that quotes the request's own credential has
it masked by `mask_credential` before the client sees it (the proxy).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# scheme://userinfo@ — the userinfo is whatever precedes the last '@' of the authority.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#@]*)@")
# A credential in free text: an HTTP authorization value (`Bearer …`, `Basic …`), or
# anything shaped like a JWT (`eyJ…`, the base64url of a JSON object's start).
_CREDENTIAL = re.compile(
    r"(?i)\b(?P<scheme>bearer|basic)(?P<sep>\s+)[A-Za-z0-9\-._~+/]+=*"
    r"|\beyJ[A-Za-z0-9_\-]{8,}(?:\.[A-Za-z0-9_\-]*){0,2}"
)
# `mask_credential`: the length of the pieces of a credential looked for, and how many
# pieces (besides its first and last) are spread over a long credential.
_PIECE = 16
_PIECES = 32
# A credential shorter than this (a development static token like `alice`) is not
# looked for: it would mask every word that happens to equal it.
_MIN_CREDENTIAL = 8
# A path-like token: starts with '/', '~/', './' or '../' and is not inside a word or
# a network URL (`host:6379/0`, `I/O`, `redis://` stay); `sqlite:///…` is a path.
_PATH = re.compile(
    r"(?:(?<=sqlite://)|(?<=file://)|(?<![\w:/.~\-]))(?:~|\.{1,2})?/[^\s;,'\"()\[\]{}<>]+"
)


def redact_url(url: str) -> str:
    """The URL with its password masked (`redis://:***@host:6379/0`); every host of a
    multi-host URL (`redis+cluster://:***@h1:7000,h2:7000`) is kept as written."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, sep, _password = userinfo.partition(":")
    if not at or not sep:
        return url  # no userinfo, or a user name only
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{hosts}"))


def redact_text(text: str) -> str:
    """Free text with the userinfo of every URL in it masked (keeping a user name), and
    every credential (`Bearer …`, `Basic …`, a JWT) masked."""

    def mask(match: re.Match[str]) -> str:
        user, sep, _password = match["userinfo"].partition(":")
        if not sep:
            return match[0]  # a user name only, no password
        return f"{match['scheme']}{user}:{MASK}@"

    def credential(match: re.Match[str]) -> str:
        return f"{match['scheme']}{match['sep']}{MASK}" if match["scheme"] else MASK

    return _CREDENTIAL.sub(credential, _USERINFO.sub(mask, text))


def mask_credential(body: bytes, authorization: str) -> bytes:
    """`body` with the quoted parts of the credential of the `Authorization` header
    value `authorization` masked: wherever the body holds the credential's first or
    last `_PIECE` characters, or one of `_PIECES` pieces spread over it, the longest
    run the body and the credential share there becomes `MASK`. So a quote of the
    credential's start (a server quoting a header's first bytes), of its end, or of any
    long part of it is masked, whole.

    A few `bytes.find` per piece and a binary search per quote: cheap enough for every
    error answer, whatever the body holds."""
    scheme, _, rest = authorization.strip().partition(" ")
    secret = (rest.strip() or scheme).encode("latin-1", "replace")
    if len(secret) < _MIN_CREDENTIAL or not body:
        return body
    mask = MASK.encode()
    if len(secret) <= _PIECE:
        return body.replace(secret, mask)
    last = len(secret) - _PIECE
    step = max(_PIECE, last // _PIECES)
    for start in sorted({0, last, *range(step, last, step)}):
        piece = secret[start : start + _PIECE]
        if piece not in body:
            continue
        out = bytearray()
        done = 0  # body[:done] is in `out`
        while (found := body.find(piece, done)) != -1:
            back = _shared_before(body, found, done, secret, start)
            ahead = _shared_after(body, found + _PIECE, secret, start + _PIECE)
            out += body[done : found - back] + mask
            done = found + _PIECE + ahead
        body = bytes(out + body[done:])
    return body


def _shared_after(a: bytes, i: int, b: bytes, j: int) -> int:
    """The largest n with a[i:i+n] == b[j:j+n] (a binary search over C comparisons)."""
    low, high = 0, min(len(a) - i, len(b) - j)
    while low < high:
        mid = (low + high + 1) // 2
        if a[i : i + mid] == b[j : j + mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _shared_before(a: bytes, i: int, floor: int, b: bytes, j: int) -> int:
    """The largest n with a[i-n:i] == b[j-n:j], not reaching before a[floor]."""
    low, high = 0, min(i - floor, j)
    while low < high:
        mid = (low + high + 1) // 2
        if a[i - mid : i] == b[j - mid : j]:
            low = mid
        else:
            high = mid - 1
    return low


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


def yaml_problem(exc: Exception) -> str:
    """A YAML parser's complaint without its snippet of the offending line (which may
    hold a token or a secret): where (line, column) and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = str(getattr(exc, "problem", None) or getattr(exc, "context", None) or "")
    problem = problem[:120] or "a syntax error"
    return f"{where}: {problem}" if where else problem
