"""The parse stage's cache of parsed targets: bounded in entries and in bytes (a hostile
review filled it with 1.3 GB of 64 KB targets from unauthenticated clients)."""

from __future__ import annotations

from sidecar.pipeline.parse import CACHE_SIZE, MAX_CACHED, ParseStage


def test_long_targets_are_parsed_but_not_remembered() -> None:
    stage = ParseStage(max_header_bytes=32768)
    for i in range(CACHE_SIZE + 10):
        stage._parse("GET", f"/version?q{i}=" + ":" * 65000)
        stage._parse("GET", f"/api/v1/tenants/acme/pods?limit={i}")
    assert len(stage._parsed) <= CACHE_SIZE
    assert all(len(raw) <= MAX_CACHED for _, raw in stage._parsed)
    assert ("GET", f"/api/v1/tenants/acme/pods?limit={CACHE_SIZE + 9}") in stage._parsed
