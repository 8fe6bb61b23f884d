"""Request and response bodies of the backing store: JSON in, JSON out, Status errors.

The store reads JSON only (DESIGN §10): a request body whose `Content-Type` is not a
JSON type (`application/json` and the three JSON patch types) is 415, before the body
is read: a Kubernetes protobuf or CBOR body, `text/plain`, YAML apply patches. A body
without `Content-Type` is read as JSON (so `curl -d '{...}'` works)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .errors import StatusError, bad_request

MAX_BODY_BYTES = 3 * 1024 * 1024
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
        return json.loads(raw, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None


async def read_object(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        content_type="application/json",
    )


def raw_response(text: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=text, content_type="application/json")
