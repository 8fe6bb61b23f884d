"""Refusals that cost upstream calls (issue 12, finding 9; DESIGN §1, §6).

The tenant rate limit runs right after authentication, before isolation,
authorization, owner lookups, body reads and access reviews. So every request of an
authenticated caller spends from its own tenant's budget, whether it is allowed,
concealed or refused, and once over the limit the caller makes no upstream call at
all. Real store and sidecar processes; a recording pass-through in front of the store
counts what reaches it.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from yarl import URL

from tests.rigs.raw_http import json_of, read_message
from tests.rigs.tenancy import SHIPPED_POLICIES, Env, running

BURST = 5
# One token per 1000 s: within a test the bucket never refills.
RATE_LIMITS = f"""\
kind: RateLimit
metadata: {{name: default}}
spec: {{tenant: "*", rate: 0.001, burst: {BURST}}}
---
kind: RateLimit
metadata: {{name: operators}}
spec: {{tenant: system, rate: 1000, burst: 1000}}
"""
ATTEMPTS = 3 * BURST


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    """The shipped policies (node owners included) with a small burst per tenant."""
    policies = tmp_path / "policies"
    shutil.copytree(SHIPPED_POLICIES, policies)
    (policies / "60-rate-limits.yaml").write_text(RATE_LIMITS)
    async with running(tmp_path, policies) as e:
        status, body = await e.call(
            "admin", "POST", "/api/v1/tenants", {"metadata": {"name": "acme"}}
        )
        assert status == 201, body
        yield e


def assert_limited(status: int, body: object) -> None:
    assert status == 429, body
    assert isinstance(body, dict)
    assert body["kind"] == "Status"
    assert body["code"] == 429


async def test_concealed_requests_spend_the_callers_budget(env: Env) -> None:
    """beta's user probes acme's objects: concealed 404s, then 429, charged to beta."""
    statuses = []
    for i in range(ATTEMPTS):
        status, body = await env.call(
            "beta-admin", "GET", f"/api/v1/tenants/acme/namespaces/default/configmaps/c{i}"
        )
        statuses.append(status)
        if i >= BURST:
            assert_limited(status, body)
    assert statuses == [404] * BURST + [429] * (ATTEMPTS - BURST)
    # The budget spent is beta's own: its own namespace is now refused too...
    status, body = await env.call(
        "beta-admin", "GET", "/api/v1/tenants/beta/namespaces/default/configmaps"
    )
    assert_limited(status, body)
    # ...while acme's is whole.
    status, _ = await env.call("acme-admin", "GET", "/api/v1/tenants/acme/namespaces")
    assert status == 200
    assert env.upstream_saw("/tenants/acme/namespaces/default/configmaps") == []


async def test_missing_node_lookups_stop_at_the_limit(env: Env) -> None:
    """An owner-rule user asks for nodes that do not exist: each answer needs an owner
    lookup upstream; past the burst the answer is 429 and the upstream sees nothing."""
    statuses = []
    for i in range(ATTEMPTS):
        status, body = await env.call("acme-owner", "GET", f"/api/v1/nodes/missing-{i}")
        statuses.append(status)
        if i >= BURST:
            assert_limited(status, body)
    assert statuses == [404] * BURST + [429] * (ATTEMPTS - BURST)
    looked_up = env.upstream_saw("/nodes/missing-")
    assert len(looked_up) == BURST, looked_up
    assert all(f"/missing-{i}" in path for i, (_, path) in enumerate(looked_up))


async def test_access_reviews_stop_at_the_limit(env: Env) -> None:
    """Access reviews about owner-rule items cost an owner lookup each; past the burst
    they are 429 before the body is read or the upstream asked."""
    review = "/apis/authorization.k8s.io/v1/tenants/acme/selfsubjectaccessreviews"
    statuses = []
    for i in range(ATTEMPTS):
        spec = {
            "resourceAttributes": {
                "verb": "get",
                "resource": "nodes",
                "name": f"gone-{i}",
                "scope": "cluster",
            }
        }
        status, body = await env.call("acme-owner", "POST", review, {"spec": spec})
        statuses.append(status)
        if i >= BURST:
            assert_limited(status, body)
        else:
            assert status != 429, body  # an answer (allowed: false), whatever it says
    assert len(env.upstream_saw("/nodes/gone-")) == BURST, statuses
    # Over the limit, a body over maxBodyBytes is not even looked at: 429, not 413.
    huge = {"spec": {"resourceAttributes": {"verb": "get", "resource": "x" * (4 << 20)}}}
    status, body = await env.call("acme-owner", "POST", review, huge)
    assert_limited(status, body)
    # A caller's own namespace and every other request of the tenant share one budget.
    status, body = await env.call("acme-admin", "GET", "/api/v1/tenants/acme/namespaces")
    assert_limited(status, body)
    assert len(env.upstream_saw("/nodes/gone-")) == BURST


async def test_a_refused_expect_continue_gets_no_100_and_its_body_is_never_read(
    env: Env,
) -> None:
    """Over its limit, a client that asks `Expect: 100-continue` before sending a body
    gets the 429 itself, never a `100 Continue`; the body it did not send is never
    waited for, nothing reaches the upstream, and the connection ends after the answer
    (its unsent body's fate is unknown, DESIGN §8)."""
    for _ in range(BURST):
        await env.call("acme-admin", "GET", "/api/v1/tenants/acme/namespaces")
    body = b'{"metadata":{"name":"never-sent"}}'
    head = (
        "POST /api/v1/tenants/acme/namespaces/default/configmaps HTTP/1.1\r\n"
        "Host: sidecar.test\r\nAuthorization: Bearer acme-admin\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Expect: 100-continue\r\n\r\n"
    ).encode()
    port = URL(env.url).port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)  # headers only: the body waits for a 100 that must not come
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await read_message(reader, request=False)
            assert answer is not None
            assert answer.status == 429, answer.start
            assert json_of(answer)["reason"] == "TooManyRequests"
            assert await reader.read() == b""  # closed after the answer
    finally:
        writer.close()
    assert env.upstream_saw("never-sent") == []
    assert env.upstream_saw("/configmaps") == []
