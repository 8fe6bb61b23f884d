"""Attack: a number JSON cannot carry, stored for everyone else to choke on (issue 28,
finding 4; DESIGN §9, §10).

`1e400` in a create or strategic-merge body was stored as `Infinity`; from then on the
admin's cluster-wide list was invalid JSON for strict clients (Go's encoding/json,
kubectl). Every body that reaches the store or the sidecar's own parser (JSON
create and update, merge, strategic merge and JSON patch, server-side apply as YAML or
JSON, an access review) with a number that does not fit a 64-bit float (`1e400`, a
400-digit integer), `NaN`, `Infinity` or `-Infinity` is a 400 Status naming the
problem: nothing stored, nothing charged. Afterwards every list still parses with a
strict parser. Real store and sidecar processes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tests.rigs.stack import ADMIN, ALICE, Env, running_env

# The literals, as written into the body's bytes.
JSON_LITERALS = {
    "overflow": "1e400",
    "negative overflow": "-1e400",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "huge integer": "1" + "0" * 400,
}
YAML_LITERALS = {
    "overflow": "1.0e+400",
    "infinity": ".inf",
    "negative infinity": "-.inf",
    "nan": ".nan",
    "huge integer": "1" + "0" * 400,
}
NS = "/api/v1/namespaces/ns1"
LISTS = (
    "/api/v1/configmaps",
    "/api/v1/services",
    "/api/v1/pods",
    "/apis/compute/v1/servers",
)
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a float")
    return value


def _fitting(text: str) -> int:
    value = int(text)
    float(value)  # OverflowError beyond a float's range, as a strict client would fail
    return value


def strict_loads(raw: bytes) -> Any:
    """JSON as a strict client (Go's encoding/json) reads it."""
    return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite, parse_int=_fitting)


async def send(env: Env, method: str, path: str, body: str, ctype: str) -> tuple[int, Any]:
    return await env.call(ALICE, method, path, body.encode(), content_type=ctype)


def assert_refused(status: int, body: Any, what: str) -> None:
    assert status == 400, (what, status, body)
    assert isinstance(body, dict), (what, body)
    assert body.get("kind") == "Status", (what, body)
    assert body["code"] == 400, (what, body)
    assert "number" in body["message"], (what, body)
    assert "Traceback" not in body["message"], (what, body)


async def assert_lists_are_strict_json(env: Env) -> None:
    for path in LISTS:
        async with env.http.get(env.url + path, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            raw = await r.read()
        assert r.status == 200, (path, raw[:300])
        try:
            strict_loads(raw)
        except (ValueError, OverflowError) as exc:
            raise AssertionError(f"{path} is not strict JSON ({exc}): {raw[:300]!r}") from None


async def stored_names(env: Env, path: str) -> list[str]:
    status, body = await env.call(ADMIN, "GET", path)
    assert status == 200, body
    return sorted(item["metadata"]["name"] for item in body["items"])


async def test_creates_and_updates_store_nothing(tmp_path: Path) -> None:
    async with running_env(tmp_path, limit=5) as env:
        status, body = await env.call(
            ALICE, "POST", f"{NS}/configmaps", {"metadata": {"name": "keep"}, "data": {"a": "1"}}
        )
        assert status == 201, body
        for n, (what, lit) in enumerate(JSON_LITERALS.items()):
            # A quota-tracked create (the sidecar reads the body) and untracked ones
            # (the body goes to the store as sent).
            creates = {
                f"{NS}/configmaps": f'{{"metadata":{{"name":"c{n}"}},"extra":{{"n":{lit}}}}}',
                f"{NS}/pods": (
                    f'{{"metadata":{{"name":"p{n}"}},"spec":{{"containers":[{{"name":"c",'
                    f'"image":"x","resources":{{"requests":{{"cpu":{lit}}}}}}}]}}}}'
                ),
                f"{NS}/services": (
                    f'{{"metadata":{{"name":"s{n}"}},"spec":{{"ports":[{{"port":{lit}}}]}}}}'
                ),
                "/apis/compute/v1/namespaces/ns1/servers": (
                    f'{{"metadata":{{"name":"v{n}"}},"spec":{{"ram":{lit}}}}}'
                ),
            }
            for path, text in creates.items():
                status, body = await send(env, "POST", path, text, "application/json")
                assert_refused(status, body, f"create {path} with {what}")
            status, body = await send(
                env,
                "PUT",
                f"{NS}/configmaps/keep",
                f'{{"metadata":{{"name":"keep"}},"data":{{"a":"2"}},"extra":{lit}}}',
                "application/json",
            )
            assert_refused(status, body, f"update with {what}")
        assert await stored_names(env, "/api/v1/configmaps") == ["keep"]
        for path in LISTS[1:]:
            assert await stored_names(env, path) == [], path
        status, cm = await env.call(ALICE, "GET", f"{NS}/configmaps/keep")
        assert cm["data"] == {"a": "1"}, cm
        assert "extra" not in cm, cm
        # Nothing charged: the one configmap, no servers, no CPU.
        assert await env.used("acme", "configmaps") == ("1", "0")
        assert await env.used("acme", "servers") == ("0", "0")
        assert await env.used("acme", "requests.cpu") == ("0", "0")
        await assert_lists_are_strict_json(env)


async def test_patches_store_nothing(tmp_path: Path) -> None:
    async with running_env(tmp_path, limit=5) as env:
        service = {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80, "name": "http"}]}}
        status, body = await env.call(ALICE, "POST", f"{NS}/services", service)
        assert status == 201, body
        before = body
        path = f"{NS}/services/web"
        for what, lit in JSON_LITERALS.items():
            patches = {
                MERGE: f'{{"spec":{{"weight":{lit}}}}}',
                STRATEGIC: f'{{"spec":{{"ports":[{{"name":"http","port":{lit}}}]}}}}',
                JSON_PATCH: f'[{{"op":"add","path":"/spec/weight","value":{lit}}}]',
                # Server-side apply of a JSON body (the apply type reads JSON too).
                APPLY: (
                    '{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},'
                    f'"spec":{{"weight":{lit}}}}}'
                ),
            }
            for ctype, text in patches.items():
                query = "?fieldManager=test" if ctype == APPLY else ""
                status, body = await send(env, "PATCH", path + query, text, ctype)
                assert_refused(status, body, f"{ctype} with {what}")
        for what, lit in YAML_LITERALS.items():
            text = (
                f"apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  weight: {lit}\n"
            )
            status, body = await send(env, "PATCH", path + "?fieldManager=test", text, APPLY)
            assert_refused(status, body, f"YAML apply with {what}")
            # ... and an apply that would create the object.
            text = text.replace("name: web", "name: fresh")
            status, body = await send(
                env, "PATCH", f"{NS}/services/fresh?fieldManager=test", text, APPLY
            )
            assert_refused(status, body, f"YAML apply creating with {what}")
        status, after = await env.call(ALICE, "GET", path)
        assert status == 200, after
        assert after["spec"] == before["spec"], after
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert await stored_names(env, "/api/v1/services") == ["web"]
        await assert_lists_are_strict_json(env)


async def test_access_review_bodies_are_refused(tmp_path: Path) -> None:
    # The sidecar answers reviews itself: its own parser must refuse them too.
    async with running_env(tmp_path, limit=5) as env:
        for what, lit in JSON_LITERALS.items():
            text = (
                '{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview",'
                f'"spec":{{"resourceAttributes":{{"verb":"get","resource":"pods"}}}},"x":{lit}}}'
            )
            status, body = await send(
                env,
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                text,
                "application/json",
            )
            assert_refused(status, body, f"review with {what}")
