"""Hot reload in-process: a real PolicyStore on a temporary directory, a real Reloader.

Bad inputs from the issue (not YAML, not a mapping, no kind, huge file, symlink loop,
deleted mid-reload, written in two steps) must never crash the reloader nor leave the
store without a policy.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.config.settings import ReloadConfig
from sidecar.policy.source import files as policy_files
from sidecar.policy.source.reload import Reloader, fingerprint
from sidecar.policy.source.store import PolicyStore
from sidecar.services.metrics import Metrics
from tests.rigs.waiting import eventually

GOOD = """\
kind: ClusterRole
metadata: {name: viewer}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
"""

OTHER = """\
kind: ClusterRole
metadata: {name: editor}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list, create]}
"""


def _counter(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("sidecar_policy_reload_total", {"result": result})
    return value or 0.0


def _info_revision(metrics: Metrics) -> str | None:
    for metric in metrics.registry.collect():
        if metric.name == "sidecar_policy":
            for sample in metric.samples:
                return sample.labels.get("revision")
    return None


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    d = tmp_path / "policies"
    d.mkdir()
    (d / "roles.yaml").write_text(GOOD)
    return d


def _remove_dir(d: Path) -> None:
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


def make(policy_dir: Path, **kw: float | bool) -> tuple[PolicyStore, Reloader, Metrics]:
    store = PolicyStore([policy_dir])
    metrics = Metrics()
    cfg = ReloadConfig(
        enabled=bool(kw.get("enabled", False)),
        debounce_seconds=float(kw.get("debounce", 0.05)),
        poll_seconds=float(kw.get("poll", 0.0)),
    )
    return store, Reloader(store, metrics, cfg), metrics


async def wait_until(cond: Callable[[], bool], limit: float = 10.0) -> None:
    await eventually(cond, limit)


async def test_good_change_swaps_and_updates_metrics(policy_dir: Path) -> None:
    store, reloader, metrics = make(policy_dir)
    old = store.current
    assert _info_revision(metrics) == old.revision
    (policy_dir / "more.yaml").write_text(OTHER)
    assert await reloader.reload_now() is True
    assert store.current is not old
    assert store.current.revision != old.revision
    assert {d.name for d in store.current.documents} == {"viewer", "editor"}
    assert _counter(metrics, "success") == 1
    assert _info_revision(metrics) == store.current.revision
    ok, detail = await reloader.ready()
    assert ok
    assert store.current.revision in detail
    assert "refused" not in detail


async def test_unchanged_files_do_not_swap(policy_dir: Path) -> None:
    store, reloader, metrics = make(policy_dir)
    old = store.current
    assert await reloader.reload_now() is False
    assert store.current is old
    assert _counter(metrics, "unchanged") == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "a policy document must be a mapping"),
        ("metadata: {name: x}\n", "document has no 'kind'"),
        ("kind: NoSuchKind\nmetadata: {name: x}\n", "unknown kind 'NoSuchKind'"),
        (b"\xff\xfe not utf-8", "not UTF-8"),
    ],
)
async def test_broken_change_is_refused_and_shown(
    policy_dir: Path, content: str | bytes, message: str
) -> None:
    store, reloader, metrics = make(policy_dir)
    good = store.current
    bad = policy_dir / "broken.yaml"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    assert await reloader.reload_now() is False
    assert store.current is good
    assert any(message in p.message and p.file == str(bad) for p in store.last_error)
    assert _counter(metrics, "failure") == 1
    ok, detail = await reloader.ready()
    assert ok is True
    # /readyz names no file path (DESIGN §9): the count and the revision in force.
    assert str(bad) not in detail
    assert str(policy_dir) not in detail
    assert "1 problem" in detail
    assert good.revision in detail
    # Fixing the file clears the refusal and swaps.
    bad.write_text(OTHER)
    assert await reloader.reload_now() is True
    ok, detail = await reloader.ready()
    assert "refused" not in detail
    assert store.last_error == []


async def test_huge_file_is_refused(policy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, reloader, _ = make(policy_dir)
    good = store.current
    monkeypatch.setattr(policy_files, "MAX_FILE_BYTES", 4096)
    (policy_dir / "huge.yaml").write_text("# " + "x" * 10000 + "\n" + OTHER)
    assert await reloader.reload_now() is False
    assert store.current is good
    assert any("larger than 4096 bytes" in p.message for p in store.last_error)


async def test_symlink_loop_does_not_hang_or_crash(policy_dir: Path) -> None:
    store, reloader, _ = make(policy_dir)
    good = store.current
    sub = policy_dir / "sub"
    sub.mkdir()
    (sub / "loop").symlink_to(policy_dir, target_is_directory=True)
    assert await reloader.reload_now() is False
    assert store.current is good
    assert any("symlink loop" in p.message for p in store.last_error)


async def test_directory_emptied_or_removed_keeps_last_policy(policy_dir: Path) -> None:
    store, reloader, _ = make(policy_dir)
    good = store.current
    (policy_dir / "roles.yaml").write_text("")
    assert await reloader.reload_now() is False
    assert store.current is good
    assert any("no documents" in p.message for p in store.last_error)
    _remove_dir(policy_dir)
    assert await reloader.reload_now() is False
    assert store.current is good
    assert any("no such policy" in p.message for p in store.last_error)


async def test_file_deleted_mid_reload_loads_again(
    policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file disappears between discovery and reading: that load is discarded (the
    fingerprint changed) and the next one sees the directory as it is now."""
    store, reloader, _ = make(policy_dir)
    victim = policy_dir / "victim.yaml"
    victim.write_text(OTHER)
    real_read = Path.read_bytes
    deleted: list[bool] = []

    def read_then_vanish(self: Path) -> bytes:
        if self == victim and not deleted:
            deleted.append(True)
            victim.unlink()
            raise FileNotFoundError(2, "No such file or directory")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_then_vanish)
    assert await reloader.reload_now() is False  # back to just roles.yaml = unchanged
    assert deleted
    assert store.last_error == []
    assert {d.name for d in store.current.documents} == {"viewer"}


async def test_truncate_then_write_is_coalesced(policy_dir: Path) -> None:
    """A file written in two steps (truncated, then written) inside one debounce window
    is read once, complete."""
    store, reloader, metrics = make(policy_dir, enabled=True, poll=0.02, debounce=0.3)
    await reloader.start()
    try:
        target = policy_dir / "roles.yaml"
        fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
        try:
            os.fsync(fd)
            # the behaviour under test: a pause between the two steps, inside the debounce
            await asyncio.sleep(0.1)
            os.write(fd, (GOOD + "---\n" + OTHER).encode())
        finally:
            os.close(fd)
        await wait_until(lambda: reloader.attempts >= 1)
        assert {d.name for d in store.current.documents} == {"viewer", "editor"}
        assert reloader.refusals == 0
        assert _counter(metrics, "failure") == 0
    finally:
        await reloader.stop()


async def test_watcher_picks_up_change_with_notifications(policy_dir: Path) -> None:
    store, reloader, _ = make(policy_dir, enabled=True, debounce=0.05)
    await reloader.start()
    try:
        await asyncio.wait_for(reloader.watching.wait(), 10)
        old = store.current.revision
        (policy_dir / "more.yaml").write_text(OTHER)
        await wait_until(lambda: store.current.revision != old)
        assert {d.name for d in store.current.documents} == {"viewer", "editor"}
    finally:
        await reloader.stop()


async def test_watcher_polling_refuses_broken_then_accepts_fix(policy_dir: Path) -> None:
    store, reloader, _ = make(policy_dir, enabled=True, poll=0.05, debounce=0.05)
    await reloader.start()
    try:
        good = store.current
        bad = policy_dir / "bad.yaml"
        bad.write_text("kind: [\n")
        await wait_until(lambda: reloader.refusals >= 1)
        assert store.current is good
        bad.write_text(OTHER)
        await wait_until(lambda: store.current is not good)
        assert store.last_error == []
    finally:
        await reloader.stop()


async def test_forced_request_skips_the_debounce(policy_dir: Path) -> None:
    """What the app's SIGHUP handler calls (tests/sidecar/test_app.py sends the signal)."""
    store, reloader, _ = make(policy_dir, enabled=False, debounce=30)
    await reloader.start()
    try:
        old = store.current.revision
        (policy_dir / "more.yaml").write_text(OTHER)
        reloader.request(force=True)
        # The debounce is 30 s: only the forced path can make this in time.
        await wait_until(lambda: store.current.revision != old, limit=5)
    finally:
        await reloader.stop()


async def test_burst_of_edits_is_debounced(policy_dir: Path) -> None:
    store, reloader, _ = make(policy_dir, enabled=False, debounce=0.2)
    await reloader.start()
    try:
        for i in range(20):
            (policy_dir / f"r{i}.yaml").write_text(OTHER.replace("editor", f"editor{i}"))
            reloader.request()
            await asyncio.sleep(0.01)  # the behaviour under test: edits 10 ms apart
        await wait_until(lambda: reloader.attempts >= 1)
        # the behaviour under test: two more debounce windows pass with no second reload
        await asyncio.sleep(0.4)
        assert reloader.attempts == 1
        assert len(store.current.documents) == 21
    finally:
        await reloader.stop()


def test_fingerprint_changes_with_content(policy_dir: Path) -> None:
    before = fingerprint([policy_dir])
    (policy_dir / "roles.yaml").write_text(GOOD + "\n# a comment making it longer\n")
    assert fingerprint([policy_dir]) != before


async def test_configmap_style_atomic_symlink_swap(tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as `name -> ..data/name` with `..data` a symlink
    that is swapped atomically on update; the watcher must notice and reload."""
    d = tmp_path / "cm"
    d.mkdir()
    (d / "..v1").mkdir()
    (d / "..v1" / "roles.yaml").write_text(GOOD)
    (d / "..data").symlink_to("..v1")
    (d / "roles.yaml").symlink_to("..data/roles.yaml")
    store, reloader, _ = make(d, enabled=True, debounce=0.05)
    assert {doc.name for doc in store.current.documents} == {"viewer"}
    await reloader.start()
    try:
        await asyncio.wait_for(reloader.watching.wait(), 10)
        (d / "..v2").mkdir()
        (d / "..v2" / "roles.yaml").write_text(OTHER)
        (d / "..data_tmp").symlink_to("..v2")
        os.replace(d / "..data_tmp", d / "..data")
        await wait_until(lambda: {doc.name for doc in store.current.documents} == {"editor"})
    finally:
        await reloader.stop()


@pytest.mark.parametrize("poll", [0.0, 0.05])
async def test_watching_is_set_while_the_watcher_runs(policy_dir: Path, poll: float) -> None:
    """Notifications (poll 0) or polling: `watching` is set once the watcher runs, and
    a change made right after it is noticed; cleared again by stop()."""
    store, reloader, _ = make(policy_dir, enabled=True, poll=poll, debounce=0.05)
    assert not reloader.watching.is_set()
    await reloader.start()
    try:
        await asyncio.wait_for(reloader.watching.wait(), 10)
        old = store.current.revision
        (policy_dir / "more.yaml").write_text(OTHER)
        await wait_until(lambda: store.current.revision != old)
    finally:
        await reloader.stop()
    assert not reloader.watching.is_set()


async def test_a_disabled_reloader_never_watches(policy_dir: Path) -> None:
    _, reloader, _ = make(policy_dir, enabled=False)
    await reloader.start()
    try:
        assert not reloader.watching.is_set()
    finally:
        await reloader.stop()
