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
