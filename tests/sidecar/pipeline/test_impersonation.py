"""The impersonation stage's parts that live beyond one request: the audit line names
both identities, and an open watch's identity is whom its request acts as (the stage
end to end: tests/security/test_impersonation.py, real processes)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from sidecar.core.identity import Identity
from sidecar.core.status import StatusError
from sidecar.pipeline.audit import line_for
from sidecar.pipeline.context import RequestContext
from sidecar.pipeline.impersonation import ImpersonationStage
from sidecar.services.audit import encode

ALICE = Identity("alice", "acme", ("tenant-admins",), "static-token")


def context(headers: list[tuple[str, str]]) -> RequestContext:
    return RequestContext(
        request=make_mocked_request("GET", "/version", headers=CIMultiDict(headers)),
        request_id="req-1",
        policy=cast(Any, SimpleNamespace(revision="rev-0")),
        max_body_bytes=10,
    )


@pytest.mark.parametrize("user", ["dave", 'a "quoted"\u2028name'])
def test_the_audit_line_names_who_sent_the_request(user: str) -> None:
    ctx = context([])
    ctx.identity = Identity(user, "acme", ("developers",), "static-token", impersonated_by=ALICE)
    line = line_for(ctx, 200)
    record = json.loads(line)
    assert list(record)[:5] == ["time", "requestId", "user", "tenant", "groups"]
    assert record["impersonatedBy"] == {"user": "alice", "tenant": "acme"}
    expected = {
        k: record[k] for k in ("time", "requestId", "user", "tenant", "groups", "impersonatedBy")
    }
    expected.update({k: v for k, v in record.items() if k not in expected})
    assert line == encode(expected)
    assert record["user"] == user
    ctx.identity = ALICE
    assert "impersonatedBy" not in json.loads(line_for(ctx, 200))


def test_an_open_watch_is_checked_against_whom_it_acts_as() -> None:
    acting = ImpersonationStage.acting_identity(lambda request: ALICE)
    plain = context([])
    assert acting(plain.request) == ALICE
    asked = context([("Impersonate-User", "dave"), ("Impersonate-Group", "developers")])
    assert acting(asked.request) == Identity(
        "dave", "acme", ("developers",), "static-token", impersonated_by=ALICE
    )
    with pytest.raises(StatusError) as bad:
        acting(context([("Impersonate-Group", "developers")]).request)
    assert bad.value.code == 400
