"""Every 415 the sidecar answers says what a kubectl user can do (issue 29)."""

from __future__ import annotations

import pytest

from sidecar.core.status import StatusError
from sidecar.pipeline.kubectl_hints import with_kubectl_hint


@pytest.mark.parametrize(
    ("method", "says"),
    [
        ("POST", "kubectl create --raw /api/v1/namespaces/ns1/serviceaccounts/sa/token -f"),
        ("PUT", "kubectl replace --raw /api/v1/namespaces/ns1/serviceaccounts/sa/token -f"),
        ("DELETE", "kubectl delete --raw /api/v1/namespaces/ns1/serviceaccounts/sa/token"),
        ("PATCH", "--type merge"),
    ],
)
def test_a_415_names_the_kubectl_command(method: str, says: str) -> None:
    exc = StatusError(415, "protobuf bodies of kind TokenRequest are not supported.")
    hinted = with_kubectl_hint(exc, method, "/api/v1/namespaces/ns1/serviceaccounts/sa/token")
    assert says in hinted.message
    assert hinted.code == 415
    assert hinted.reason == "UnsupportedMediaType"
    assert with_kubectl_hint(hinted, method, "/x").message == hinted.message  # once


def test_other_errors_are_left_alone() -> None:
    exc = StatusError(400, "bad")
    assert with_kubectl_hint(exc, "POST", "/api/v1/x") is exc


def test_a_subresource_post_gives_the_request_object_not_a_dry_run() -> None:
    """`kubectl create token` has no `--dry-run`: the hint gives the TokenRequest to write
    (found by a newcomer following the hint)."""
    exc = StatusError(415, "protobuf bodies of kind TokenRequest are not supported.")
    path = "/api/v1/tenants/acme/namespaces/default/serviceaccounts/bot/token"
    hinted = with_kubectl_hint(exc, "POST", path)
    assert '"kind": "TokenRequest"' in hinted.message
    assert "--dry-run" not in hinted.message
    assert f"kubectl create --raw {path} -f object.json" in hinted.message
    created = with_kubectl_hint(exc, "POST", "/api/v1/tenants/acme/namespaces/default/secrets")
    assert "--dry-run=client -o json" in created.message
