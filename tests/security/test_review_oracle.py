"""Attack: access reviews as an existence oracle (issue 12; DESIGN §5).

A review of a node the caller does not own answered `allowed: false`, a review of a
missing node answered 404: a tenant could probe which node names exist. A review
answers exactly what the request it describes would get (404 for both), so it gives
the same answer for an unowned object and a missing one, in every mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.rigs import modes
from tests.rigs.tenancy import Env, seed

REVIEWS = "/apis/authorization.k8s.io/v1/tenants/acme/selfsubjectaccessreviews"


def review(verb: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": verb,
                "resource": "nodes",
                "name": name,
                "scope": "cluster",
            }
        },
    }


async def _ask(env: Env, verb: str, name: str) -> tuple[int, Any]:
    return await env.call("acme-owner", "POST", REVIEWS, review(verb, name))


@pytest.mark.parametrize("mode", modes.MODES)
async def test_unowned_and_missing_nodes_get_the_same_review(tmp_path: Path, mode: str) -> None:
    async with modes.running(tmp_path, mode) as env:
        await seed(env, {"mine": "acme", "theirs": "beta", "free": None})
        for verb in ("get", "patch", "delete"):
            answers = {}
            for name in ("theirs", "free", "missing"):
                status, body = await _ask(env, verb, name)
                assert status == 201, (verb, name, status, body)
                st = body["status"]
                assert st["allowed"] is False
                answers[name] = {k: str(v).replace(name, "NAME") for k, v in st.items()}
            assert answers["theirs"] == answers["free"] == answers["missing"], answers
            # The live requests agree: 404 with the same body.
            live = [
                await env.call("acme-owner", "GET", f"/api/v1/nodes/{n}")
                for n in ("theirs", "missing")
            ]
            assert [s for s, _ in live] == [404, 404]
        status, body = await _ask(env, "get", "mine")
        assert status == 201, body
        assert body["status"]["allowed"] is True, body
