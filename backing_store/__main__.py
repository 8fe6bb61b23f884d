"""`backing-store --host H --port P --db FILE [--assume-tenant T]` (also
`python -m backing_store`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from .app import make_app


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="backing-store", description="The reference backing store the sidecar forwards to."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=8080, help="port to listen on (0 picks a free one)"
    )
    parser.add_argument("--db", default="./.backing-store/store.db", help="SQLite file")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.add_argument(
        "--assume-tenant",
        default=None,
        metavar="TENANT",
        help="caller tenant for short paths without X-Remote-Tenant (direct kubectl/curl "
        "use; 'system' means tenant default); off by default: such a request is a 400",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    app = make_app(args.db, args.assume_tenant)
    runner = web.AppRunner(
        app, access_log=logging.getLogger("aiohttp.access") if args.access_log else None
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    print(f"backing-store listening on http://{host}:{port} (db {args.db})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.db)), exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        asyncio.run(serve(args))
    except OSError as exc:
        print(f"backing-store: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
