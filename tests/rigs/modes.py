"""The enforcement modes the isolation and owner attack tests run under (DESIGN §5
"Decisions": a mode relaxes only refusals inside the caller's own tenant).

- `enforce`: the default.
- `dry-run`: the global mode (config `mode: dry-run`).
- `tenant-dry-run`: a `TenantMode` document puts the attacker's tenant(s) in dry-run,
  the rest of the cluster enforced.

`under(mode, tmp, policies, tenants)` gives the policy directory and the config keys
to start a sidecar with: for `tenant-dry-run` a copy of `policies` plus one
`TenantMode` per tenant (a copy, so the shipped tree and a test's own directory are
never changed). `running(tmp, mode, …)`: `tests/rigs/tenancy.running` in that mode.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.rigs import tenancy

MODES = ("enforce", "dry-run", "tenant-dry-run")


def tenant_modes(tenants: tuple[str, ...], mode: str = "dry-run") -> str:
    """`TenantMode` documents putting each tenant in `mode`."""
    return "---\n".join(
        f"kind: TenantMode\nmetadata: {{name: test-{t}}}\nspec: {{tenant: {t}, mode: {mode}}}\n"
        for t in tenants
    )


def under(
    mode: str, tmp: Path, policies: Path, tenants: tuple[str, ...] = ("acme",)
) -> tuple[Path, dict[str, Any]]:
    """(policy directory, config keys) for a sidecar in `mode`."""
    if mode == "enforce":
        return policies, {}
    if mode == "dry-run":
        return policies, {"mode": "dry-run"}
    if mode != "tenant-dry-run":
        raise ValueError(f"unknown mode {mode!r}")
    copy = tmp / f"policies-{'-'.join(tenants)}-dry-run"
    shutil.copytree(policies, copy)
    # The shipped tree may give some tenant a mode already: keep it unless it is ours.
    for path in copy.rglob("*.yaml"):
        text = path.read_text()
        for t in tenants:
            if f"tenant: {t}\n  mode:" in text:
                raise ValueError(f"{path} already sets a mode for {t}")
    (copy / "zz-test-modes.yaml").write_text(tenant_modes(tenants))
    return copy, {}


@asynccontextmanager
async def running(
    tmp: Path,
    mode: str,
    policies: Path = tenancy.SHIPPED_POLICIES,
    tenants: tuple[str, ...] = ("acme",),
    **config: Any,
) -> AsyncIterator[tenancy.Env]:
    """The tenancy rig (store, recorder, sidecar) with the sidecar in `mode`; for
    `tenant-dry-run` the `tenants` (the attackers') are in dry-run."""
    chosen, keys = under(mode, tmp, policies, tenants)
    async with tenancy.running(tmp, chosen, **keys, **config) as env:
        yield env
