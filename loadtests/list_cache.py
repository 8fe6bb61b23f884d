"""A cache in front of the backing store for the `big-lists` scenario:
`python -m loadtests.list_cache --store URL --port P --path PATH --query K=V`.

The reference store is one thread: it takes about 0.2 s to produce a 10 MB node list,
so 16 lists asked for at once hold every other request it serves (the other tenant's
small reads included) for about 3 s; that is the store's property, not the sidecar's.
This process fetches the list once from the store at start and answers every `GET
PATH` whose query has `K=V` with those bytes (a fixed-length answer, as the store
gives, written as the client reads it); every other request is passed to the store as
it is.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

PIECE = 64 * 1024
_PASSED = ("content-type", "accept", "x-remote-user", "x-remote-tenant", "x-remote-group")


def make_app(store: str, path: str, key: str, value: str) -> web.Application:
    app = web.Application()
    cached: dict[str, bytes] = {}

    async def start(app: web.Application) -> None:
        session = aiohttp.ClientSession(auto_decompress=False)
        app["session"] = session
        async with session.get(f"{store}{path}?{key}={value}") as r:
            if r.status != 200:
                raise RuntimeError(f"the store answered the list {r.status}")
            cached["list"] = await r.read()

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == path and request.query.get(key) == value:
            return await _send(request, cached["list"])
        headers = [(k, v) for k, v in request.headers.items() if k.lower() in _PASSED]
        body = await request.read()
        session: aiohttp.ClientSession = app["session"]
        async with session.request(
            request.method, store + request.raw_path, headers=headers, data=body or None
        ) as r:
            data = await r.read()
            return web.Response(
                status=r.status,
                body=data,
                headers={"Content-Type": r.headers.get("Content-Type", "application/json")},
            )

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _send(request: web.Request, body: bytes) -> web.StreamResponse:
    """`body` with its Content-Length, written a piece at a time as the client reads,
    so 16 lists at once never hold this process's event loop (or a copy of each)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    for start in range(0, len(body), PIECE):
        await response.write(view[start : start + PIECE])
    await response.write_eof()
    return response


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtests.list_cache")
    parser.add_argument("--store", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--query", required=True, help="K=V the cached list is asked with")
    args = parser.parse_args()
    key, _, value = args.query.partition("=")
    web.run_app(
        make_app(args.store, args.path, key, value),
        host="127.0.0.1",
        port=args.port,
        print=None,
    )


if __name__ == "__main__":
    main()
