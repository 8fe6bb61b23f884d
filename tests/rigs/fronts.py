"""The decision service's rig (DESIGN §13): the real store behind two recording relays,
the real sidecar (full proxy + `authz.listen` + `authz.grpcListen`) in front of one of
them, and real Envoy (HTTP and gRPC ext_authz) and nginx from the generated configs in
front of the other. So every request that reaches the store says which way it came:
through the proxy (`proxy_relay`) or forwarded by a front itself (`direct_relay`).

Each relay records, per request, the method, the raw target and the headers it
received, and forwards the same bytes' meaning to the store (aiohttp, target kept
encoded as received), streaming the answer back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDictProxy
from yarl import URL

from sidecar.cli.fronts_launch import start_envoy, start_nginx
from sidecar.cli.launch import HOST, ProcessGroup, StartError, free_port
from tests.rigs import processes

CORPUS_HEADER = "x-corpus"
_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "te", "upgrade"}
)


@dataclass
class Seen:
    method: str
    target: str
    headers: CIMultiDictProxy[str]

    @property
    def corpus(self) -> str:
        return self.headers.get(CORPUS_HEADER, "")

    def identity(self) -> tuple[str, str, tuple[str, ...]]:
        """(user, tenant, groups): groups from every `X-Remote-Group`, comma-split (a
        front that cannot repeat a header joins them)."""
        groups: list[str] = []
        for value in self.headers.getall("X-Remote-Group", ()):
            groups += [g for g in value.split(",") if g]
        return (
            self.headers.get("X-Remote-User", ""),
            self.headers.get("X-Remote-Tenant", ""),
            tuple(groups),
        )

    def identity_like(self) -> list[str]:
        """Header names the upstream could act on as identity, besides the three."""
        names = []
        for name in self.headers:
            lower = name.lower().replace("_", "-")
            if lower in ("x-remote-user", "x-remote-tenant", "x-remote-group"):
                continue
            if lower.startswith(("x-remote-", "impersonate-", "x-sidecar-")):
                names.append(name)
        return names


@dataclass
class Relay:
    """A recording relay to the store."""

    store: str
    seen: list[Seen] = field(default_factory=list)
    runner: web.AppRunner | None = None
    port: int = 0
    session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def by_corpus(self, tag: str) -> list[Seen]:
        return [s for s in self.seen if s.corpus == tag]

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        server = web.Server(self._handle)
        self.runner = web.ServerRunner(server)  # type: ignore[assignment]
        assert self.runner is not None
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, HOST, self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.seen.append(Seen(request.method, request.raw_path, request.headers))
        assert self.session is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        body = await request.read() if request.body_exists else None
        async with self.session.request(
            request.method,
            URL(self.store + request.raw_path, encoded=True),
            headers=headers,
            data=body,
            allow_redirects=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type", "Accept"),
        ) as answer:
            response = web.StreamResponse(status=answer.status)
            for k, v in answer.headers.items():
                if k.lower() not in _HOP:
                    response.headers.add(k, v)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


@dataclass
class Fronts:
    proxy: str  # the sidecar's full proxy
    authz: str  # the decision listener (HTTP)
    grpc: tuple[str, int]
    envoy: str
    envoy_grpc: str
    nginx: str
    store: str
    proxy_relay: Relay
    direct_relay: Relay
    sidecar: processes.Proc

    @property
    def entrances(self) -> dict[str, str]:
        return {
            "proxy": self.proxy,
            "envoy": self.envoy,
            "envoy-grpc": self.envoy_grpc,
            "nginx": self.nginx,
        }


@asynccontextmanager
async def running_fronts(
    tmp: Path, policy: str, tokens: list[dict[str, Any]], **extra: Any
) -> AsyncIterator[Fronts]:
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(policy)
    token_file = processes.write_tokens(tmp, tokens)
    with ProcessGroup() as started:
        store = started.add(processes.start_store(tmp))
        proxy_relay, direct_relay = Relay(store.url), Relay(store.url)
        await proxy_relay.start()
        await direct_relay.start()
        try:
            for attempt in range(3):  # the decision ports are picked here: retried
                authz_port, grpc_port = free_port(), free_port()
                config: dict[str, Any] = {
                    "upstream": proxy_relay.url,
                    "policies": str(policies),
                    "identity": {"tokenFile": str(token_file)},
                    "reload": {"enabled": False},
                    "authz": {
                        "listen": f"{HOST}:{authz_port}",
                        "grpcListen": f"{HOST}:{grpc_port}",
                    },
                }
                config.update(extra)
                try:
                    sidecar = started.add(processes.start_sidecar(tmp, config))
                    break
                except StartError:
                    if attempt == 2:
                        raise
            upstream = (HOST, direct_relay.port)
            authz = (HOST, authz_port)
            proxy = (HOST, sidecar.port)
            envoy = started.add(start_envoy(tmp, upstream, authz, proxy))
            envoy_grpc = started.add(
                start_envoy(tmp, upstream, authz, proxy, grpc=(HOST, grpc_port), name="envoyg")
            )
            nginx = started.add(start_nginx(tmp, upstream, authz, proxy))
            yield Fronts(
                proxy=sidecar.url,
                authz=f"http://{HOST}:{authz_port}",
                grpc=(HOST, grpc_port),
                envoy=envoy.url,
                envoy_grpc=envoy_grpc.url,
                nginx=nginx.url,
                store=store.url,
                proxy_relay=proxy_relay,
                direct_relay=direct_relay,
                sidecar=sidecar,
            )
        finally:
            await proxy_relay.stop()
            await direct_relay.stop()
