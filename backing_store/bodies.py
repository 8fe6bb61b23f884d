"""Request and response bodies of the backing store: JSON in, JSON out, Status errors.

The store reads JSON (DESIGN §10): a request body whose `Content-Type` is not a JSON
type (`application/json` and the three JSON patch types) is 415, before the body is
read: a Kubernetes protobuf or CBOR body, `text/plain`, forms. The one exception is
server-side apply (`PATCH` with `application/apply-patch+yaml`), whose body is YAML or
JSON (`read_apply`). A body without `Content-Type` is read as JSON (so `curl -d '{...}'`
works).

Every body is checked before any handler sees it (`_check_tree`): at most
`MAX_DEPTH` levels of nesting, and no string that is not valid Unicode (a JSON
`"\\udfff"` escape decodes to a lone surrogate that no answer or SQLite row could
hold); either is a 400, never a 500 later on.

The store keeps only JSON a strict client can read back (Go's encoding/json, kubectl):
a number that does not fit a 64-bit float (`1e400`, an integer of 400 digits), `NaN`,
`Infinity` or `-Infinity`, in a JSON body or a YAML apply body (`.inf`, `.nan`), is a
400 naming it (`not_json_number`). The sidecar's parser has the same rule
(`sidecar/core/strict_json.py`); this is the store's own copy, as a service of its own.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml
from aiohttp import web

from .errors import StatusError, bad_request

MAX_BODY_BYTES = 3 * 1024 * 1024
# Kubernetes objects nest a couple of dozen levels at most; a limit keeps every
# recursive walk over a body (patches, managed fields) far from Python's own.
MAX_DEPTH = 100
APPLY_PATCH = "application/apply-patch+yaml"
JSON_TYPES = frozenset(
    {
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
    }
)


def check_media_type(request: web.Request) -> None:
    """415 for a request body that is not JSON (a missing Content-Type is fine)."""
    if "Content-Type" not in request.headers or not request.body_exists:
        return
    ctype = request.content_type
    if ctype == APPLY_PATCH and request.method == "PATCH":
        return
    if ctype not in JSON_TYPES:
        raise StatusError(
            415,
            f"the backing store reads JSON only, not Content-Type {ctype!r}; "
            "send application/json (kubectl: use -f with a JSON or YAML file)",
        )


async def read_body(request: web.Request) -> bytes:
    """The raw body (aiohttp keeps it: reading it again costs nothing)."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise StatusError(413, f"the body is larger than {MAX_BODY_BYTES} bytes") from None


async def read_json(request: web.Request) -> Any:
    raw = await read_body(request)
    if not raw.strip():
        raise bad_request("the request needs a JSON body")
    try:
        body = loads_strict(raw)
    except NotJsonNumber as exc:
        raise exc.refusal() from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep() from None
    _check_tree(body)
    return body


async def read_object(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


async def read_apply(request: web.Request) -> dict[str, Any]:
    """The body of a server-side apply: a YAML (or JSON) mapping, as JSON values.

    As Kubernetes (sigs.k8s.io/yaml) reads it: timestamps stay strings, and keys that
    YAML reads as numbers, booleans or null become their text."""
    raw = await read_body(request)
    if not raw.strip():
        raise bad_request("an apply patch needs a YAML or JSON body (the whole object)")
    try:
        body = loads_strict(raw)
    except NotJsonNumber as exc:
        # JSON but for a number (never read again as YAML, which would keep `1e400`
        # or `NaN` as text).
        raise exc.refusal() from None
    except (UnicodeDecodeError, ValueError):
        body = _load_yaml(raw)
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise bad_request("an apply patch must be a YAML or JSON object (the whole object)")
    _check_tree(body)
    return body


_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it


class _ApplyLoader(_SafeLoader):  # type: ignore[misc]
    """Safe YAML without the timestamp type (a date is a string in JSON)."""


_ApplyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load_yaml(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
        return _as_json(yaml.load(text, Loader=_ApplyLoader), 0, [_MAX_NODES])
    except UnicodeDecodeError:
        raise bad_request("the apply body is not UTF-8") from None
    except yaml.YAMLError as exc:
        raise bad_request(f"the apply body is not valid YAML or JSON: {exc}") from None
    except ValueError:  # an integer beyond Python's own limit of digits (SafeLoader's int())
        raise NotJsonNumber("an integer of thousands of digits").refusal() from None
    except RecursionError:
        raise _too_deep() from None


# A body can hold at most one value per byte; more means YAML aliases are expanding it.
_MAX_NODES = MAX_BODY_BYTES


def _as_json(value: Any, depth: int, budget: list[int]) -> Any:
    """A YAML document as JSON values: text keys, no NaN/infinity, no binary or dates."""
    budget[0] -= 1
    if budget[0] < 0:
        raise bad_request("the apply body expands to more values than its size allows")
    if depth > MAX_DEPTH:
        raise _too_deep()
    if isinstance(value, dict):
        return {_key_text(k): _as_json(v, depth + 1, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v, depth + 1, budget) for v in value]
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int | float):
        if not _fits(value):
            raise NotJsonNumber(_yaml_literal(value)).refusal()
        return value
    raise bad_request(f"the apply body holds a YAML {type(value).__name__}, not a JSON value")


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, int | float):
        return str(key)
    raise bad_request("the apply body has a map key that is not a scalar")


def _check_tree(body: Any) -> None:
    """400 for a body nested deeper than MAX_DEPTH or holding invalid Unicode text."""
    stack: list[tuple[Any, int]] = [(body, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= MAX_DEPTH:
                raise _too_deep()
            for key, item in value.items():
                _check_text(key)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if depth >= MAX_DEPTH:
                raise _too_deep()
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            _check_text(value)


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(
            "the body holds a string that is not valid Unicode (a lone UTF-16 surrogate "
            "such as \\udfff)"
        ) from None


def _too_deep() -> StatusError:
    return bad_request(f"the body nests deeper than {MAX_DEPTH} levels")


class NotJsonNumber(ValueError):
    """A number JSON cannot carry (`literal` as the body wrote it)."""

    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal

    def refusal(self) -> StatusError:
        shown = self.literal if len(self.literal) <= 24 else self.literal[:23] + "…"
        return bad_request(
            f"the body holds {shown}, a number JSON cannot carry "
            "(numbers must be finite and fit a 64-bit float)"
        )


# An integer needs at least this many digits to pass a float's range (1.8e308), so
# integers are checked one by one only in a body holding such a run of digits.
_LONG_DIGITS = re.compile(rb"[0-9]{309}")


def loads_strict(raw: bytes) -> Any:
    """`raw` as JSON; `NotJsonNumber` for NaN, ±Infinity or a number beyond a float."""
    if _LONG_DIGITS.search(raw):
        return json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
    return json.loads(raw, parse_constant=_constant, parse_float=_float)


def _constant(name: str) -> Any:
    raise NotJsonNumber(name)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJsonNumber(text)
    return value


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # beyond Python's own limit of digits
        raise NotJsonNumber(text) from None
    if not _fits(value):
        raise NotJsonNumber(text)
    return value


def _fits(value: float) -> bool:
    """Whether a number (YAML's, or an integer of any size) is one JSON can carry."""
    if isinstance(value, float):
        return math.isfinite(value)
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _yaml_literal(value: float) -> str:
    if isinstance(value, float):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return str(value)


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        content_type="application/json",
    )


def raw_response(text: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=text, content_type="application/json")
