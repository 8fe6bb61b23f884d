"""Hostile review of the decision service's fronts (redteam.md class 9, issue 31): what
a client could forge between the front, the decider and the proxy. The same cases run
through real Envoy and nginx in tests/system/test_decision_service.py; here, the
decider's side of each, in-process."""

from __future__ import annotations

import json

from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.edge.authz.decider import DIRECT, PROXY
from sidecar.edge.authz.fastserver import Question
from sidecar.edge.authz.marker import HEADER, Marker
from tests.sidecar.edge.test_authz import CM, Rig, rig

__all__ = ["rig"]  # the fixture, used by name below


async def test_a_client_route_or_marker_never_routes_direct(rig: Rig) -> None:
    for name, value in (("x-sidecar-route", "direct"), (HEADER, "9999999999." + "0" * 64)):
        decided = await rig.decide("GET", CM, **{name.replace("-", "_"): value})
        assert decided.allowed is not None
        assert decided.allowed.route == PROXY
        signed = dict(decided.allowed.headers)[HEADER]
        assert signed != value  # the decider's own marker, never the client's


async def test_client_identity_headers_are_not_read_and_go_to_the_proxy(rig: Rig) -> None:
    decided = await rig.decide("GET", CM, X_Remote_User="admin", X_Remote_Tenant="system")
    assert decided.allowed is not None
    assert decided.allowed.route == PROXY
    assert "x-remote-user" not in dict(decided.allowed.headers)
    # Without a credential, the headers authenticate nobody (no trusted front here).
    anonymous = await rig.decide("GET", CM, None, X_Remote_User="admin")
    assert anonymous.refusal is not None
    assert anonymous.refusal.status == 401


async def test_joined_impersonation_headers_are_left_to_the_proxy(rig: Rig) -> None:
    """Envoy joins two Impersonate-Group headers into one value for its check."""
    sent = [
        ("Authorization", "Bearer alice"),
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "users,devs"),
    ]
    joined = await rig.decider.decide("GET", CM, sent, "10.0.0.1", joined=True)
    assert joined.allowed is not None
    assert joined.allowed.route == PROXY
    assert HEADER not in dict(joined.allowed.headers)  # undecided here: the proxy charges
    plain = await rig.decider.decide("GET", CM, sent, "10.0.0.1")
    assert plain.refusal is not None or (plain.allowed and plain.allowed.route == PROXY)


async def test_nginx_replays_only_refusals_the_decider_sealed(rig: Rig) -> None:
    refused = await rig.handler(
        Question(
            "GET",
            "/nginx",
            [("X-Original-Method", "GET"), ("X-Original-URI", CM)],
            b"",
            "10.0.0.1",
        )
    )
    assert refused.startswith(b"HTTP/1.1 401")
    sealed = next(
        line.split(b": ", 1)[1].decode()
        for line in refused.split(b"\r\n")
        if line.lower().startswith(b"x-decision:")
    )
    replayed = await rig.handler(
        Question("GET", "/nginx/denied", [("x-decision", sealed)], b"", "")
    )
    assert replayed.startswith(b"HTTP/1.1 401")
    assert b'"code": 401' in replayed
    forged = sealed[:-1] + ("0" if sealed[-1] != "0" else "1")
    answer = await rig.handler(Question("GET", "/nginx/denied", [("x-decision", forged)], b"", ""))
    assert answer.startswith(b"HTTP/1.1 403")


async def test_a_direct_allow_never_carries_the_marker(rig: Rig) -> None:
    decided = await rig.decide("GET", CM)
    assert decided.allowed is not None
    assert decided.allowed.route == DIRECT
    assert HEADER not in dict(decided.allowed.headers)


# -- tenant contexts through a front (issue 29's `/tenants/{t}` prefix, DESIGN §3) ------
# The decider read `/tenants/acme/api/v1/...` as a non-resource URL: every kubectl
# context request through Envoy or nginx was a 403 the proxy never gives (alice's own
# context) and another tenant's context a 403 instead of the proxy's concealing 404.


async def test_a_tenant_context_is_read_as_the_proxy_reads_it(rig: Rig) -> None:
    short = "/api/v1/namespaces/dev/configmaps"
    decided = await rig.decide("GET", "/tenants/acme" + short)
    assert decided.refusal is None, decided.refusal and decided.refusal.body
    assert decided.allowed is not None
    assert decided.allowed.route == PROXY
    # The marker is for the request the proxy reads after its dispatch took the
    # context off (what its rate-limit stage verifies): charged once.
    signed = dict(decided.allowed.headers)[HEADER]
    assert rig.decider.marker.verify(signed, "GET", short, "Bearer alice")


async def test_a_tenant_context_path_is_never_forwarded_direct(rig: Rig) -> None:
    """The rest of `/tenants/acme/api/v1/tenants/acme/…` is canonical, but the front
    would forward the whole context path: only the proxy rewrites it."""
    full = "/tenants/acme" + CM
    for _ in range(2):  # and never from the cache
        decided = await rig.decide("GET", full)
        assert decided.allowed is not None, decided.refusal and decided.refusal.body
        assert decided.allowed.route == PROXY
        assert "x-remote-user" not in dict(decided.allowed.headers)


async def test_another_tenants_context_is_the_proxys_concealing_404(rig: Rig) -> None:
    messages = []
    for tenant in ("acme", "ghost"):
        decided = await rig.decide(
            "GET", f"/tenants/{tenant}/api/v1/namespaces/dev/configmaps", "bob"
        )
        assert decided.refusal is not None
        assert decided.refusal.status == 404
        body = json.loads(decided.refusal.body)  # type: ignore[arg-type]
        messages.append(body["message"].replace(tenant, "T"))
    assert messages[0] == messages[1]


# -- charge-once: a marker saves one charge, once ----------------------------------------
# A client that can reach the decision listener (the webhook's docs put a TLS terminator
# before it for the API server) asked `/nginx` once and replayed the marker to the proxy:
# 20 uncharged requests in its 30 s (tests/security/test_marker_replay.py, real processes).


def test_a_marker_saves_one_charge_once() -> None:
    marker = Marker(30, key=b"k" * 32)
    value = marker.sign("GET", "/a", "Bearer x")
    headers = CIMultiDictProxy(CIMultiDict({HEADER: value, "Authorization": "Bearer x"}))
    assert marker.already_charged("GET", "/a", headers)
    assert not marker.already_charged("GET", "/a", headers)  # replayed: charged
    # Two identical requests decided in the same second get two markers, each good once.
    again = marker.sign("GET", "/a", "Bearer x")
    assert again != value
    headers = CIMultiDictProxy(CIMultiDict({HEADER: again, "Authorization": "Bearer x"}))
    assert marker.already_charged("GET", "/a", headers)


# -- the Kubernetes webhook: the review's tenant is the one decided ---------------------


async def test_a_webhook_review_is_decided_in_its_resource_tenant(rig: Rig) -> None:
    """`scope: cluster` (the sidecar's own access-review field) dropped Arktos'
    `resourceAttributes.tenant` and decided the caller's own tenant: allowed, for a
    list in another tenant."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "alice",
            "groups": ["users"],
            "extra": {"tenant": ["acme"]},
            "resourceAttributes": {
                "verb": "list",
                "resource": "configmaps",
                "tenant": "beta",
                "scope": "cluster",
            },
        },
    }
    answer = await rig.handler(
        Question(
            "POST",
            "/kubernetes",
            [("Content-Type", "application/json")],
            json.dumps(review).encode(),
            "127.0.0.1",
        )
    )
    status = json.loads(answer.partition(b"\r\n\r\n")[2])["status"]
    assert status["allowed"] is False, status
    assert status["denied"] is True, status
