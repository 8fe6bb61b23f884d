"""Request and response bodies of the backing store: JSON in, JSON out, Status errors."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from sidecar.errors import StatusError, bad_request

MAX_BODY_BYTES = 3 * 1024 * 1024


async def read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise StatusError(413, f"the body is larger than {MAX_BODY_BYTES} bytes") from None
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
