"""The audit log on a disk that cannot take it (issue 29, item 10; DESIGN §9).

Found by fault injection: with the disk under the audit log full, every record was
dropped while `/readyz` stayed 200 with nothing degraded, 732 ERROR tracebacks went to
the log in 15 s, and one record was cut mid-line. Now the audit writer is part of
readiness (`audit` degraded, with the reason, the sidecar still ready), one log line
per interval says so, and records are written whole or not at all. Real store and
sidecar processes; the full disk is the sidecar's file size limit (RLIMIT_FSIZE, set
from outside with `prlimit`: writes stop at the limit part-way through a batch, as on a
full disk, with no mount and no root), and `/dev/full` as the audit path.
"""

from __future__ import annotations

import asyncio
import json
import resource
from pathlib import Path
from typing import Any

import aiohttp

from tests.rigs import processes
from tests.rigs.policies import admin_policy
from tests.rigs.waiting import eventually

ADMIN = {"Authorization": "Bearer admin"}
FAILURE_LINE = "audit: cannot write the audit log"
# The audit file starts this large, so the file size limit (a little above it) stays
# far above every other file the sidecar writes (its log, the SQLite ledger).
PREFILL = 8 * 1024 * 1024
ROOM = 6000  # a couple of records fit under the limit; the next batch is cut there


def start(procs: processes.Processes, tmp: Path, audit: str) -> processes.Proc:
    store = procs.store()
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(admin_policy("servers: 3"))
    tokens = processes.write_tokens(
        tmp, [{"token": "admin", "user": "admin", "tenant": "system", "groups": []}]
    )
    return procs.sidecar(
        {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(tokens)},
            "reload": {"enabled": False},
            "audit": {"path": audit},
        }
    )


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url + "/readyz") as resp:
        return resp.status, await resp.json()


async def traffic(http: aiohttp.ClientSession, url: str, n: int) -> None:
    """`n` requests, each with its audit record; a few at a time, so batches form."""
    for start_at in range(0, n, 10):
        batch = [
            http.get(f"{url}/api/v1/tenants/default/namespaces/{i}", headers=ADMIN)
            for i in range(start_at, min(n, start_at + 10))
        ]
        for resp in await asyncio.gather(*batch):
            await resp.read()
            assert resp.status in (200, 404), resp.status
            resp.release()


async def audit_check(http: aiohttp.ClientSession, url: str, ok: bool) -> dict[str, Any]:
    async def seen() -> dict[str, Any] | None:
        status, body = await readyz(http, url)
        check = body["checks"]["audit"]
        if check["ok"] is not ok:
            return None
        assert status == 200, body  # degraded, never unready: the sidecar still serves
        assert body["ready"] is True, body
        return body

    return await eventually(seen, within=15, what=f"/readyz shows audit ok={ok}")


def assert_whole_records(raw: bytes) -> int:
    """Every line of the file is a whole JSON record; the number of records."""
    assert raw.endswith(b"\n"), raw[-200:]
    lines = raw[:-1].split(b"\n")
    for number, line in enumerate(lines):
        try:
            json.loads(line)
        except ValueError:
            raise AssertionError(
                f"line {number + 1} is not a whole record: {line[:200]!r}"
            ) from None
    return len(lines)


async def test_a_full_disk_shows_in_readiness_and_never_cuts_a_record(
    procs: processes.Processes, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.log"
    audit.write_bytes(b'{"prefill":true}\n' * (PREFILL // 17))
    sidecar = start(procs, tmp_path, str(audit))
    pid = sidecar.proc.pid
    async with aiohttp.ClientSession() as http:
        await traffic(http, sidecar.url, 5)
        await eventually(lambda: audit.stat().st_size > PREFILL, what="records written")
        before = assert_whole_records(audit.read_bytes())
        limit = audit.stat().st_size + ROOM
        # The disk is full (the soft limit only: lifting it again needs no privilege).
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            await traffic(http, sidecar.url, 300)
            body = await audit_check(http, sidecar.url, ok=False)
            detail = body["checks"]["audit"]["detail"]
            assert "File too large" in detail, detail
            assert "audit" in body["degraded"], body
            assert str(tmp_path) not in json.dumps(body)
            await traffic(http, sidecar.url, 300)  # failing for a while: still one line
            raw = audit.read_bytes()
            assert len(raw) <= limit
            during = assert_whole_records(raw)
            assert before < during < before + 300, (before, during)
        finally:
            unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            resource.prlimit(pid, resource.RLIMIT_FSIZE, unlimited)  # space again
        await traffic(http, sidecar.url, 5)
        await audit_check(http, sidecar.url, ok=True)
        async with http.get(sidecar.url + "/metrics", headers=ADMIN) as resp:
            metrics = await resp.text()
    after = assert_whole_records(audit.read_bytes())
    assert after >= during + 5
    dropped = [ln for ln in metrics.splitlines() if ln.startswith("sidecar_audit_dropped_total")]
    assert dropped, metrics[:500]
    assert float(dropped[0].split()[-1]) >= 300, dropped
    log = sidecar.own_log()
    assert log.count(FAILURE_LINE) == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert "writing the audit log again" in log


async def test_an_audit_log_on_dev_full_is_degraded_with_the_reason(
    procs: processes.Processes, tmp_path: Path
) -> None:
    sidecar = start(procs, tmp_path, "/dev/full")
    async with aiohttp.ClientSession() as http:
        await traffic(http, sidecar.url, 200)
        body = await audit_check(http, sidecar.url, ok=False)
        assert "No space left on device" in body["checks"]["audit"]["detail"], body
        assert "/dev/full" not in json.dumps(body)
        await traffic(http, sidecar.url, 200)
        await audit_check(http, sidecar.url, ok=False)
    log = sidecar.own_log()
    assert log.count(FAILURE_LINE) == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
