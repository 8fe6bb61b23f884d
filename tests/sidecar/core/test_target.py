"""The request-target parser: every row of DESIGN §3, every bad input, and a property."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.target import (
    RequestTarget,
    Scope,
    SelectorError,
    TargetError,
    field_terms,
    parse_target,
)

C, T, N = Scope.CLUSTER, Scope.TENANT, Scope.NAMESPACE

# (method, path, query, expected fields)
GOOD: list[tuple[str, str, str, dict[str, object]]] = [
    # cluster scope
    ("GET", "/api/v1/nodes", "", dict(scope=C, resource="nodes", verb="list", name="")),
    ("GET", "/api/v1/nodes/n1", "", dict(scope=C, resource="nodes", name="n1", verb="get")),
    ("HEAD", "/api/v1/nodes/n1", "", dict(verb="get")),
    (
        "PUT",
        "/api/v1/nodes/n1/power",
        "",
        dict(resource="nodes", subresource="power", verb="update"),
    ),
    ("GET", "/api/v1/nodes/n1/power", "", dict(subresource="power", verb="get")),
    ("POST", "/api/v1/nodes", "", dict(verb="create", scope=C)),
    ("DELETE", "/api/v1/nodes", "", dict(verb="deletecollection")),
    ("DELETE", "/api/v1/nodes/n1", "", dict(verb="delete", name="n1")),
    ("PATCH", "/api/v1/nodes/n1", "", dict(verb="patch")),
    ("GET", "/api/v1/persistentvolumes/pv-1", "", dict(scope=C, resource="persistentvolumes")),
    (
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "",
        dict(api_group="rbac.authorization.k8s.io", api_version="v1", resource="clusterroles"),
    ),
    # the Tenant object
    ("GET", "/api/v1/tenants", "", dict(scope=C, resource="tenants", verb="list", tenant=None)),
    (
        "GET",
        "/api/v1/tenants/acme",
        "",
        dict(scope=C, resource="tenants", name="acme", tenant="acme"),
    ),
    ("DELETE", "/api/v1/tenants/acme", "", dict(verb="delete", tenant="acme")),
    (
        "PUT",
        "/api/v1/tenants/acme/status",
        "",
        dict(scope=C, resource="tenants", name="acme", subresource="status", tenant="acme"),
    ),
    ("PUT", "/api/v1/tenants/acme/finalize", "", dict(subresource="finalize", tenant="acme")),
    # tenant scope
    (
        "GET",
        "/api/v1/tenants/acme/namespaces",
        "",
        dict(scope=T, tenant="acme", resource="namespaces", verb="list"),
    ),
    (
        "GET",
        "/api/v1/tenants/acme/namespaces/dev",
        "",
        dict(scope=T, tenant="acme", resource="namespaces", name="dev", namespace=None),
    ),
    ("POST", "/api/v1/tenants/acme/namespaces", "", dict(scope=T, verb="create")),
    (
        "PUT",
        "/api/v1/tenants/acme/namespaces/dev/status",
        "",
        dict(scope=T, resource="namespaces", name="dev", subresource="status"),
    ),
    (
        "PUT",
        "/api/v1/tenants/acme/namespaces/dev/finalize",
        "",
        dict(scope=T, resource="namespaces", name="dev", subresource="finalize"),
    ),
    (
        "POST",
        "/apis/baremetal/v1/tenants/acme/allocations",
        "",
        dict(scope=T, api_group="baremetal", resource="allocations", verb="create"),
    ),
    (
        "GET",
        "/apis/baremetal/v1/tenants/acme/allocations/a1",
        "",
        dict(scope=T, resource="allocations", name="a1", verb="get"),
    ),
    (
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/tenants/acme/tenantroles",
        "",
        dict(scope=T, resource="tenantroles"),
    ),
    # tenant-wide list of a namespaced resource
    (
        "GET",
        "/api/v1/tenants/acme/pods",
        "",
        dict(scope=T, tenant="acme", resource="pods", verb="list"),
    ),
    ("GET", "/apis/compute/v1/tenants/acme/servers", "", dict(scope=T, resource="servers")),
    # namespace scope
    (
        "GET",
        "/api/v1/tenants/acme/namespaces/dev/pods",
        "",
        dict(scope=N, tenant="acme", namespace="dev", resource="pods", verb="list"),
    ),
    (
        "GET",
        "/api/v1/tenants/acme/namespaces/dev/pods/p1",
        "",
        dict(scope=N, name="p1", verb="get"),
    ),
    ("POST", "/api/v1/tenants/acme/namespaces/dev/pods", "", dict(scope=N, verb="create")),
    ("PUT", "/api/v1/tenants/acme/namespaces/dev/pods/p1", "", dict(verb="update")),
    ("PATCH", "/api/v1/tenants/acme/namespaces/dev/pods/p1", "", dict(verb="patch")),
    ("DELETE", "/api/v1/tenants/acme/namespaces/dev/pods/p1", "", dict(verb="delete")),
    ("DELETE", "/api/v1/tenants/acme/namespaces/dev/pods", "", dict(verb="deletecollection")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/pods/p1/log", "", dict(subresource="log")),
    (
        "GET",
        "/api/v1/tenants/acme/namespaces/dev/pods/status",
        "",
        dict(resource="pods", name="status", subresource=""),
    ),
    (
        "GET",
        "/apis/apps/v1/tenants/acme/namespaces/dev/deployments/web/scale",
        "",
        dict(api_group="apps", resource="deployments", name="web", subresource="scale"),
    ),
    (
        "GET",
        "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags",
        "",
        dict(resource="servers", name="web1", subresource="tags", extra=(), verb="get"),
    ),
    (
        "PUT",
        "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags/red",
        "",
        dict(subresource="tags", extra=("red",), verb="update"),
    ),
    (
        "DELETE",
        "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags/red",
        "",
        dict(subresource="tags", extra=("red",), verb="delete"),
    ),
    (
        "GET",
        "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags/a/b",
        "",
        dict(extra=("a", "b")),
    ),
    ("GET", "/apis/batch/v1/tenants/acme/namespaces/dev/jobs", "", dict(api_group="batch")),
    # short paths: no tenant in the URL
    (
        "GET",
        "/api/v1/namespaces/dev/pods",
        "",
        dict(scope=N, tenant=None, namespace="dev", resource="pods", short_path=True),
    ),
    (
        "GET",
        "/api/v1/namespaces/dev",
        "",
        dict(scope=T, tenant=None, resource="namespaces", name="dev", short_path=True),
    ),
    ("GET", "/api/v1/namespaces", "", dict(scope=T, resource="namespaces", short_path=True)),
    (
        "PUT",
        "/api/v1/namespaces/dev/finalize",
        "",
        dict(scope=T, resource="namespaces", name="dev", subresource="finalize", short_path=True),
    ),
    (
        "POST",
        "/apis/compute/v1/namespaces/dev/servers",
        "",
        dict(scope=N, verb="create", short_path=True),
    ),
    # cluster-wide list of a namespaced resource
    ("GET", "/api/v1/pods", "", dict(scope=C, resource="pods", verb="list", tenant=None)),
    ("GET", "/apis/compute/v1/servers", "", dict(scope=C, resource="servers")),
    # watch
    (
        "GET",
        "/api/v1/watch/tenants/acme/namespaces/dev/pods",
        "",
        dict(verb="watch", scope=N, tenant="acme", namespace="dev", resource="pods"),
    ),
    ("GET", "/api/v1/watch/pods", "", dict(verb="watch", scope=C)),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/pods", "watch=true", dict(verb="watch")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/pods", "watch=1", dict(verb="watch")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/pods", "watch=false", dict(verb="list")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/pods", "watch=0&limit=5", dict(verb="list")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/pods", "limit=5&watch=1", dict(verb="watch")),
    ("GET", "/api/v1/watch/namespaces/dev/pods", "", dict(verb="watch", short_path=True)),
    # percent-encoding
    ("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps/a%2Fb", "", dict(name="a/b")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps/caf%C3%A9", "", dict(name="café")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps/a%20b", "", dict(name="a b")),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps/x.y", "", dict(name="x.y")),
    ("GET", "/api/v1/nodes/%2A", "", dict(name="*")),
    ("GET", "/api/v1/%2A", "", dict(resource="*", verb="list")),
    # non-resource URLs and discovery
    ("GET", "/healthz", "", dict(resource_request=False, verb="get")),
    ("GET", "/version", "", dict(resource_request=False)),
    ("POST", "/logs/x", "", dict(resource_request=False, verb="post")),
    ("OPTIONS", "/openapi/v2", "", dict(resource_request=False, verb="options")),
    ("GET", "/", "", dict(resource_request=False)),
    ("GET", "/api", "", dict(resource_request=False)),
    ("GET", "/api/v1", "", dict(resource_request=False)),
    ("GET", "/apis", "", dict(resource_request=False)),
    ("GET", "/apis/apps", "", dict(resource_request=False)),
    ("GET", "/apis/apps/v1", "", dict(resource_request=False)),
    ("GET", "/quota/v1/defaults", "", dict(resource_request=False)),
    # the longest legal names
    ("GET", "/api/v1/tenants/" + "a" * 63, "", dict(tenant="a" * 63)),
    ("GET", "/api/v1/nodes/" + "n" * 253, "", dict(name="n" * 253)),
]

BAD: list[tuple[str, str, str, int, str]] = [
    ("GET", "/api/v1/tenants/acme/namespaces/../pods", "", 400, "'.' or '..'"),
    ("GET", "/api/v1/tenants/acme/./pods", "", 400, "'.' or '..'"),
    ("GET", "/api/v1/tenants/acme/namespaces/%2e%2e/pods", "", 400, "'.' or '..'"),
    ("GET", "/api/v1/tenants/acme/namespaces/%2E%2e/pods", "", 400, "'.' or '..'"),
    ("GET", "/api/v1/nodes/%2e", "", 400, "'.' or '..'"),
    ("GET", "/healthz/..", "", 400, "'.' or '..'"),
    ("GET", "/api/v1//pods", "", 400, "empty segment"),
    ("GET", "//api/v1/pods", "", 400, "empty segment"),
    ("GET", "/api/v1/pods/", "", 400, "empty segment"),
    ("GET", "/api/v1/nodes/%zz", "", 400, "percent-encoding"),
    ("GET", "/api/v1/nodes/abc%4", "", 400, "percent-encoding"),
    ("GET", "/api/v1/nodes/abc%", "", 400, "percent-encoding"),
    ("GET", "/api/v1/nodes/%ff%fe", "", 400, "UTF-8"),
    ("GET", "/api/v1/nodes/%c3", "", 400, "UTF-8"),
    ("GET", "/api/v1/nodes/a%00b", "", 400, "control"),
    ("GET", "/api/v1/tenants/Acme", "", 400, "DNS-1123"),
    ("GET", "/api/v1/tenants/acme_1/pods", "", 400, "DNS-1123"),
    ("GET", "/api/v1/tenants/-acme/pods", "", 400, "DNS-1123"),
    ("GET", "/api/v1/tenants/" + "a" * 64, "", 400, "longer than 63"),
    ("GET", "/api/v1/tenants/acme/namespaces/Dev/pods", "", 400, "DNS-1123"),
    ("GET", "/api/v1/tenants/acme/namespaces/" + "d" * 64 + "/pods", "", 400, "longer than 63"),
    ("GET", "/api/v1/namespaces/dev.x/pods", "", 400, "DNS-1123"),
    ("GET", "/api/v1/tenants/a%2Fb/pods", "", 400, "DNS-1123"),
    ("GET", "/api/v1/namespaces/a%2Fb/pods", "", 400, "DNS-1123"),
    ("GET", "/api/v1/nodes/" + "n" * 254, "", 400, "longer than 253"),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/pods/" + "p" * 254, "", 400, "longer than 253"),
    ("FOO", "/api/v1/pods", "", 405, "not allowed"),
    ("TRACE", "/api/v1/pods", "", 405, "not allowed"),
    ("OPTIONS", "/api/v1/pods", "", 405, "not allowed"),
    ("BREW", "/healthz", "", 405, "not allowed"),
    ("POST", "/api/v1/watch/pods", "", 405, "watch"),
    ("GET", "/api/v1/watch", "", 400, "watch/"),
    ("GET", "api/v1/pods", "", 400, "start with"),
]


def test_table_is_large_enough() -> None:
    assert len(GOOD) + len(BAD) >= 60


@pytest.mark.parametrize(("method", "path", "query", "expected"), GOOD)
def test_good_targets(method: str, path: str, query: str, expected: dict[str, object]) -> None:
    target = parse_target(method, path, query)
    for key, value in expected.items():
        assert getattr(target, key) == value, (key, target)
    assert target.path == path


@pytest.mark.parametrize(("method", "path", "query", "code", "fragment"), BAD)
def test_bad_targets(method: str, path: str, query: str, code: int, fragment: str) -> None:
    with pytest.raises(TargetError) as info:
        parse_target(method, path, query)
    assert info.value.code == code
    assert fragment in info.value.message


def test_encoded_slash_never_splits() -> None:
    target = parse_target("GET", "/api/v1/tenants/acme/namespaces/dev/pods/a%2Fb%2Fc")
    assert target.name == "a/b/c"
    assert target.subresource == ""


def test_short_path_resolution() -> None:
    target = parse_target("GET", "/api/v1/namespaces/dev/pods")
    assert target.resolve_tenant("acme").tenant == "acme"
    assert target.resolve_tenant("system").tenant == "default"
    full = parse_target("GET", "/api/v1/tenants/beta/namespaces/dev/pods")
    assert full.resolve_tenant("acme").tenant == "beta"


def test_explain_shape() -> None:
    d = parse_target(
        "PUT", "/apis/compute/v1/tenants/acme/namespaces/dev/servers/w/tags/x"
    ).as_dict()
    assert d == {
        "verb": "update",
        "apiGroup": "compute",
        "apiVersion": "v1",
        "scope": "namespace",
        "tenant": "acme",
        "namespace": "dev",
        "resource": "servers",
        "subresource": "tags",
        "name": "w",
        "resourceRequest": True,
        "path": "/apis/compute/v1/tenants/acme/namespaces/dev/servers/w/tags/x",
    }
    assert parse_target("GET", "/api/v1/nodes/n").full_resource == "nodes"


_segment = st.one_of(
    st.sampled_from(
        [
            "api",
            "apis",
            "v1",
            "tenants",
            "namespaces",
            "watch",
            "status",
            "finalize",
            "acme",
            "dev",
            "pods",
            "servers",
            "tags",
            "..",
            ".",
            "%2e",
            "%2F",
            "%",
            "%zz",
            "%ff",
            "",
            "A",
            "x" * 70,
        ]
    ),
    st.text(min_size=0, max_size=12),
)


@settings(max_examples=2000, deadline=None)
@given(
    method=st.one_of(
        st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
        st.text(max_size=8),
    ),
    segments=st.lists(_segment, max_size=10),
    query=st.text(max_size=20),
)
def test_parser_returns_target_or_its_own_error(
    method: str, segments: list[str], query: str
) -> None:
    path = "/" + "/".join(segments)
    try:
        target = parse_target(method, path, query)
    except TargetError as exc:
        assert exc.code in (400, 405)  # noqa: PT017 (either outcome is allowed; pytest.raises cannot say that)
        assert exc.message  # noqa: PT017 (either outcome is allowed; pytest.raises cannot say that)
    else:
        assert isinstance(target, RequestTarget)
        if target.resource_request:
            assert target.scope is not None
            assert target.verb in {
                "get",
                "list",
                "watch",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection",
            }


# -- fieldSelector metadata.name (DESIGN §3) -------------------------------------------

PODS = "/api/v1/tenants/acme/namespaces/dev/pods"


@pytest.mark.parametrize(
    ("method", "path", "query", "name", "verb"),
    [
        ("GET", PODS, "fieldSelector=metadata.name%3Dweb", "web", "list"),
        ("GET", PODS, "fieldSelector=metadata.name%3D%3Dweb", "web", "list"),
        ("GET", PODS, "watch=1&fieldSelector=metadata.name%3Dweb", "web", "watch"),
        (
            "GET",
            "/api/v1/watch/tenants/acme/namespaces/dev/pods",
            "fieldSelector=metadata.name=web",
            "web",
            "watch",
        ),
        # ANDed with other terms, in either order; the first name term counts.
        ("GET", PODS, "fieldSelector=metadata.namespace%3Ddev,metadata.name%3Dweb", "web", "list"),
        ("GET", PODS, "fieldSelector=metadata.name%3Da,metadata.name%3Db", "a", "list"),
        # Escapes as the store reads them.
        ("GET", PODS, "fieldSelector=metadata.name%3Da%5C%2Cb", "a,b", "list"),
        # Empty terms are skipped, as the store skips them.
        ("GET", PODS, "fieldSelector=%2Cmetadata.name%3Dweb", "web", "list"),
        # No name: inequality, another field, malformed, twice, not a path segment.
        ("GET", PODS, "fieldSelector=metadata.name!%3Dweb", "", "list"),
        ("GET", PODS, "fieldSelector=metadata.namespace%3Ddev", "", "list"),
        ("GET", PODS, "fieldSelector=metadata.name", "", "list"),
        ("GET", PODS, "fieldSelector=metadata.name%3Dweb%3Dx", "", "list"),
        ("GET", PODS, "fieldSelector=metadata.name%3D..", "", "list"),
        ("GET", PODS, "fieldSelector=metadata.name%3Da%2Fb", "", "list"),
        ("GET", PODS, "fieldSelector=metadata.name%3D", "", "list"),
        # A malformed term anywhere: the store answers 400, so no name.
        ("GET", PODS, "fieldSelector=x%3Da%5Cq,metadata.name%3Dweb", "", "list"),
        # Only lists and watches: a delete of a collection keeps its verb and no name.
        ("DELETE", PODS, "fieldSelector=metadata.name%3Dweb", "", "deletecollection"),
        ("GET", PODS + "/web", "fieldSelector=metadata.name%3Dother", "web", "get"),
    ],
)
def test_field_selector_name(method: str, path: str, query: str, name: str, verb: str) -> None:
    t = parse_target(method, path, query)
    assert (t.name, t.verb) == (name, verb)


def test_reviews_at_standard_paths_are_short_paths() -> None:
    for group, resource in (
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectrulesreviews"),
        ("authentication.k8s.io", "selfsubjectreviews"),
    ):
        t = parse_target("POST", f"/apis/{group}/v1/{resource}")
        assert (t.scope, t.tenant, t.short_path) == (T, None, True)
        assert t.resolve_tenant("acme").tenant == "acme"
        t = parse_target("POST", f"/apis/{group}/v1/tenants/beta/{resource}")
        assert (t.scope, t.tenant, t.short_path) == (T, "beta", False)
    # Other resources of those groups stay as they were.
    assert parse_target("POST", "/apis/authentication.k8s.io/v1/tokenreviews").scope == C


# -- one reading (DESIGN §1, §3, §8) -------------------------------------------------

ONE_READING_BAD: list[tuple[str, str, str]] = [
    # a fragment has no place in a request target, wherever it is
    (
        "GET",
        "/api/v1/tenants/acme/namespaces/dev/secrets?x=1#&fieldSelector=metadata.name%3Dapp",
        "'#'",
    ),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps?resourceVersion=0&watch=true#", "'#'"),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/configmaps#x", "'#'"),
    ("GET", "/api/v1/tenants/acme/namespaces/dev/config#maps?watch=1", "'#'"),
    # a decision parameter given twice, however spelled
    (
        "GET",
        f"{PODS}?fieldSelector=metadata.name%3Da&fieldSelector=metadata.name%3Db",
        "more than once",
    ),
    ("GET", f"{PODS}?watch=false&%77atch=true", "more than once"),
    ("GET", f"{PODS}?watch=1&watch=1", "more than once"),
    ("POST", f"{PODS}?dryRun=All&dryRun=All", "more than once"),
    ("GET", f"{PODS}?owner=acme&owner=beta", "more than once"),
    ("GET", f"{PODS}?labelSelector=a&label%53elector=b", "more than once"),
    ("GET", f"{PODS}?resourceVersion=1&resourceVersion=2", "more than once"),
    ("GET", f"{PODS}?timeoutSeconds=1&timeoutSeconds=2", "more than once"),
    # a query that does not parse
    ("GET", f"{PODS}?x=%zz", "percent-encoding"),
    ("GET", f"{PODS}?x=%4", "percent-encoding"),
    ("GET", f"{PODS}?x=%ff", "UTF-8"),
    ("GET", f"{PODS}?%ff=1", "UTF-8"),
    ("GET", f"{PODS}?x=%00", "control"),
    ("GET", f"{PODS}?=v", "without a name"),
    # watch is a boolean
    ("GET", f"{PODS}?watch=yes", "watch must be"),
    ("GET", f"{PODS}?watch=", "watch must be"),
]


@pytest.mark.parametrize(("method", "raw", "says"), ONE_READING_BAD)
def test_targets_two_readers_could_read_differently_are_400(
    method: str, raw: str, says: str
) -> None:
    with pytest.raises(TargetError) as err:
        parse_target(method, raw)
    assert err.value.code == 400
    assert says in err.value.message


@pytest.mark.parametrize(
    ("raw", "verb", "query"),
    [
        # encoded keys and values are decoded once, for the decision and the upstream
        (f"{PODS}?%77atch=true", "watch", (("watch", "true"),)),
        (f"{PODS}?watch=tr%75e", "watch", (("watch", "true"),)),
        (f"{PODS}?watch=1", "watch", (("watch", "true"),)),
        (f"{PODS}?watch=True", "watch", (("watch", "true"),)),
        (f"{PODS}?watch=0", "list", (("watch", "false"),)),
        (f"{PODS}?watch=%2574rue", "BAD", ()),
        (f"{PODS}?a=b+c&d=%2B", "list", (("a", "b c"), ("d", "+"))),
        (f"{PODS}?a&&b=", "list", (("a", ""), ("b", ""))),
        (f"{PODS}?x=1;watch=true", "list", (("x", "1;watch=true"),)),
        (f"{PODS}?n=%C3%A9", "list", (("n", "é"),)),
    ],
)
def test_query_decoded_once(raw: str, verb: str, query: tuple[tuple[str, str], ...]) -> None:
    if verb == "BAD":
        with pytest.raises(TargetError):
            parse_target("GET", raw)
        return
    t = parse_target("GET", raw)
    assert (t.verb, t.query) == (verb, query)


@pytest.mark.parametrize(
    ("raw", "caller", "forwarded"),
    [
        (f"{PODS}?%77atch=true", "acme", f"{PODS}?watch=true"),
        (
            f"{PODS}?watch=1&labelSelector=a+in+(x,y)",
            "acme",
            f"{PODS}?watch=true&labelSelector=a%20in%20%28x%2Cy%29",
        ),
        (f"{PODS}?", "acme", PODS),
        ("/api/v1/namespaces/dev/pods?limit=5", "acme", f"{PODS}?limit=5"),
        ("/api/v1/namespaces/dev/pods", "system", "/api/v1/tenants/default/namespaces/dev/pods"),
        (
            "/api/v1/watch/namespaces/dev/pods",
            "acme",
            "/api/v1/watch/tenants/acme/namespaces/dev/pods",
        ),
        (
            "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags/a%2Fb",
            "acme",
            "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags/a%2Fb",
        ),
        (
            "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags/%72ed%20x",
            "acme",
            "/apis/compute/v1/tenants/acme/namespaces/dev/servers/web1/tags/red%20x",
        ),
        ("/api/v1/nodes/n1;x=1", "acme", "/api/v1/nodes/n1%3Bx%3D1"),
        ("/%76ersion", "acme", "/version"),
        ("/", "acme", "/"),
    ],
)
def test_forwarded_target_is_rebuilt_from_the_parse(raw: str, caller: str, forwarded: str) -> None:
    t = parse_target("GET", raw).resolve_tenant(caller)
    assert t.upstream_target() == forwarded
    # and it reads back as the same target
    again = parse_target("GET", forwarded)
    assert (again.verb, again.resource, again.name, again.query) == (
        t.verb,
        t.resource,
        t.name,
        t.query,
    )


def test_sidecar_parameters_replace_the_clients() -> None:
    t = parse_target("GET", f"{PODS}?owner=beta&limit=3")
    assert t.upstream_target([("owner", "acme")]) == f"{PODS}?limit=3&owner=acme"
    assert parse_target("GET", PODS).upstream_target([("owner", "a b")]) == f"{PODS}?owner=a%20b"


def test_query_pairs_given_by_a_server_framework() -> None:
    """The store passes aiohttp's decoded `request.query`; its raw query is not read."""
    t = parse_target("GET", f"{PODS}?ignored=1", query_pairs=[("watch", "true")])
    assert (t.verb, t.query) == ("watch", (("watch", "true"),))
    with pytest.raises(TargetError):
        parse_target("GET", PODS, query_pairs=[("watch", "1"), ("watch", "0")])


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        ("HEAD", f"{PODS}?watch=true"),
        ("HEAD", "/api/v1/watch/tenants/acme/namespaces/dev/pods"),
        ("POST", f"{PODS}?watch=1"),
        ("DELETE", f"{PODS}?watch=true"),
    ],
)
def test_a_watch_is_a_get_only(method: str, raw: str) -> None:
    """A HEAD answer ends at its headers while a watching upstream goes on writing on
    that connection (found by a hostile review): a watch is GET alone."""
    with pytest.raises(TargetError) as err:
        parse_target(method, raw)
    assert err.value.code == 405


def test_field_terms_are_the_stores_reading() -> None:
    """One reading of a `fieldSelector` (the store's selectors use `field_terms` too)."""
    assert list(field_terms(r"a=1,,b==x\,y,c!=\\")) == [
        ("a", "=", "1"),
        ("b", "==", "x,y"),
        ("c", "!=", "\\"),
    ]
    for text, why in (
        ("a", "can't understand 'a'"),
        (r"a=\q", r"bad escape in '\\q'"),
        ("a=b=c", "unescaped '=' in 'b=c'"),
    ):
        with pytest.raises(SelectorError, match=re.escape(why)):
            list(field_terms(text))


def test_tenant_for_is_the_named_tenant_else_the_callers() -> None:
    short = parse_target("GET", "/api/v1/namespaces/dev/pods")
    assert short.tenant_for("acme") == "acme"
    assert short.tenant_for("system") == "default"  # as `resolve_tenant` fills it
    full = parse_target("GET", "/api/v1/tenants/beta/namespaces/dev/pods")
    assert full.tenant_for("acme") == "beta"
