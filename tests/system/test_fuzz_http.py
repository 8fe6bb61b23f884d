"""No request makes the sidecar answer 500: arbitrary methods, paths, credentials and
bodies through the full pipeline (shipped policies, real backing store process)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.app import build_app
from sidecar.config.settings import load_config
from tests.rigs import paths, processes

ROOT = paths.ROOT
TOKENS = {
    "admin": {
        "token": "t-admin",
        "user": "admin",
        "tenant": "system",
        "groups": ["cluster-admins"],
    },
    "alice": {
        "token": "t-alice",
        "user": "alice",
        "tenant": "acme",
        "groups": ["tenant-admins", "node-owners"],
    },
    "bob": {"token": "t-bob", "user": "bob", "tenant": "acme", "groups": ["developers"]},
    "dave": {"token": "t-dave", "user": "dave", "tenant": "beta", "groups": ["tenant-admins"]},
}

_segment = st.one_of(
    st.sampled_from(
        [
            "api",
            "apis",
            "v1",
            "compute",
            "baremetal",
            "authorization.k8s.io",
            "quota",
            "tenants",
            "namespaces",
            "acme",
            "beta",
            "system",
            "default",
            "dev",
            "servers",
            "nodes",
            "allocations",
            "pods",
            "tags",
            "power",
            "status",
            "finalize",
            "watch",
            "selfsubjectaccessreviews",
            "subjectaccessreviews",
            "usage",
            "quotas",
            "defaults",
            "web-1",
            "node-a1",
            "%2F",
            "%2e%2e",
            "%ff",
            "%",
            "*",
            "a:b",
            "caf%C3%A9",
        ]
    ),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~%", min_size=1, max_size=10),
)
_name = st.sampled_from(["web-1", "db-1", "new-1", "node-a1", "node-b1", "x", "a:b", "%2A"])
_tenant = st.sampled_from(["acme", "beta", "system", "default", "nope"])
_well_formed = st.one_of(
    st.builds(
        "/apis/compute/v1/tenants/{}/namespaces/{}/servers{}".format,
        _tenant,
        st.sampled_from(["default", "dev"]),
        st.sampled_from(["", "/web-1", "/web-1/tags", "/web-1/tags/red", "/new-1"]),
    ),
    st.builds(
        "/api/v1/nodes{}".format,
        st.sampled_from(["", "/node-a1", "/node-b1", "/node-a1/power", "/zzz"]),
    ),
    st.builds(
        "/apis/baremetal/v1/tenants/{}/allocations{}".format, _tenant, st.sampled_from(["", "/a1"])
    ),
    st.builds(
        "/quota/v1/{}".format,
        st.sampled_from(
            [
                "defaults",
                "quotas",
                "tenants/acme",
                "tenants/beta/usage",
                "tenants/acme/servers",
                "tenants/acme/namespaces/default",
                "tenants/nope/servers",
            ]
        ),
    ),
    st.builds(
        "/apis/authorization.k8s.io/v1/tenants/{}/{}".format,
        _tenant,
        st.sampled_from(["selfsubjectaccessreviews", "subjectaccessreviews"]),
    ),
    st.builds(
        "/api/v1/namespaces/default/{}{}".format,
        st.sampled_from(["pods", "configmaps", "secrets"]),
        st.sampled_from(["", "/x"]),
    ),
    st.builds("/api/v1/tenants/{}{}".format, _tenant, st.sampled_from(["", "/status"])),
    st.just("/apis/compute/v1/servers"),
)
_body = st.one_of(
    st.none(),
    st.just(b"not json"),
    st.just(b"[]"),
    st.just(b'{"metadata": {"name": "new-1"}, "tags": ["red"], "spec": {"owner": "acme"}}'),
    st.just(b'{"hard_limit": 3}'),
    st.just(b'{"tags": ["a", "b"]}'),
    st.just(
        b'{"spec": {"resourceAttributes": {"verb": "get", "resource": "servers", '
        b'"group": "compute", "namespace": "default"}}}'
    ),
    st.just(b'{"spec": {"owner": "beta"}}'),
    st.just(
        b'{"metadata": {"name": "p"}, "spec": {"containers": [{"resources": '
        b'{"requests": {"cpu": "lots"}}}]}}'
    ),
    st.builds(
        lambda d: json.dumps(d).encode(),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
            lambda inner: st.one_of(
                st.lists(inner, max_size=3),
                st.dictionaries(
                    st.sampled_from(
                        [
                            "metadata",
                            "name",
                            "spec",
                            "owner",
                            "tags",
                            "kind",
                            "hard_limit",
                            "containers",
                            "resources",
                            "requests",
                            "cpu",
                            "memory",
                            "resourceAttributes",
                            "verb",
                            "resource",
                            "namespace",
                            "tenant",
                            "user",
                        ]
                    ),
                    inner,
                    max_size=4,
                ),
            ),
            max_leaves=12,
        ),
    ),
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    store = processes.start_store(tmp)
    tokens = processes.write_tokens(tmp, list(TOKENS.values()))
    path = processes.write_config(
        tmp,
        {
            "upstream": store.url,
            "policies": str(ROOT / "policies"),
            "identity": {"tokenFile": str(tokens)},
            "ledger": f"sqlite:///{tmp / 'ledger.db'}",
            "audit": {"path": str(tmp / "audit.log")},
            "reload": {"enabled": False},
            "limits": {"upstreamReadTimeout": 5},
        },
    )
    yield {"config": load_config(path, env={}), "store": store}
    store.stop()


async def send(
    port: int | None, method: str, target: str, token: str | None, body: bytes | None
) -> int:
    assert port is not None  # a started TestServer's
    lines = [f"{method} {target} HTTP/1.1", "Host: x", "Connection: close"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    return int(status_line.split()[1])


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
            st.one_of(
                _well_formed,
                st.builds(
                    lambda segs: "/" + "/".join(segs), st.lists(_segment, min_size=1, max_size=9)
                ),
            ),
            st.sampled_from(["", "?watch=0", "?limit=2", "?owner=acme", "?tags=a,b", "?limit=x"]),
            st.sampled_from([None, "t-admin", "t-alice", "t-bob", "t-dave", "garbage", "a.b.c"]),
            _body,
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_no_request_gets_a_500(
    stack: dict[str, Any], requests: list[tuple[str, str, str, str | None, bytes | None]]
) -> None:
    async def run() -> None:
        server = TestServer(build_app(stack["config"]), host="127.0.0.1")
        await server.start_server()
        try:
            for method, path, query, token, body in requests:
                target = path + query
                status = await send(server.port, method, target, token, body)
                assert status != 500, f"{method} {target} ({token}) -> 500"
                assert status < 600
        finally:
            await server.close()

    asyncio.run(run())
