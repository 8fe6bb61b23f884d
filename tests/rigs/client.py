"""A small HTTP client for tests: `await client(token, method, path, body)` sends the
token as a bearer token and a JSON body (bytes go as they are), and returns
(status, parsed JSON or None)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp


class BearerClient:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def __call__(
        self,
        token: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        async with self.http.request(method, self.url + path, data=data, headers=headers) as r:
            raw = await r.read()
            return r.status, json.loads(raw) if raw else None
