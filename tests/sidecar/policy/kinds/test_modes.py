"""`kind: TenantMode` parsing and the mode lookup."""

from __future__ import annotations

from sidecar.policy.kinds.modes import DRY_RUN, ENFORCE, mode_for, parse_tenant_modes
from sidecar.policy.source.files import parse_yaml_documents


def parse(text: str) -> tuple[dict[str, str], list[str]]:
    docs, problems = parse_yaml_documents(text, "modes.yaml")
    assert problems == []
    modes, found = parse_tenant_modes(docs)
    return modes, [str(p) for p in found]


def test_valid_overrides() -> None:
    modes, problems = parse(
        "kind: TenantMode\nmetadata: {name: a}\nspec: {tenant: acme, mode: dry-run}\n---\n"
        "kind: TenantMode\nmetadata: {name: b}\nspec: {tenant: beta, mode: enforce}\n"
        "---\nkind: ClusterRole\nmetadata: {name: ignored}\n"
    )
    assert problems == []
    assert modes == {"acme": DRY_RUN, "beta": ENFORCE}


def test_mode_for_prefers_the_tenant_override() -> None:
    overrides = {"acme": DRY_RUN, "beta": ENFORCE}
    assert mode_for(ENFORCE, overrides, "acme") == DRY_RUN
    assert mode_for(DRY_RUN, overrides, "beta") == ENFORCE
    assert mode_for(DRY_RUN, overrides, "gamma") == DRY_RUN
    assert mode_for(ENFORCE, overrides, None) == ENFORCE


def test_problems_name_file_and_line() -> None:
    modes, problems = parse(
        "kind: TenantMode\n"  # 1
        "metadata: {name: x}\n"  # 2
        "spec:\n"  # 3
        "  tenant: '*'\n"  # 4
        "  mode: dry-run\n"  # 5
        "---\n"  # 6
        "kind: TenantMode\n"  # 7
        "metadata: {name: y}\n"  # 8
        "spec:\n"  # 9
        "  tenant: acme\n"  # 10
        "  mode: on\n"  # 11
        "---\n"  # 12
        "kind: TenantMode\n"  # 13
        "metadata: {}\n"  # 14
        "extra: 1\n"  # 15
    )
    assert modes == {}
    assert any(p.startswith("modes.yaml:4: TenantMode spec.tenant '*'") for p in problems)
    assert any(p.startswith("modes.yaml:11:") and "quote the value" in p for p in problems)
    assert any(p.startswith("modes.yaml:14: TenantMode needs metadata.name") for p in problems)
    assert any(p.startswith("modes.yaml:15: unknown field 'extra'") for p in problems)
    assert any(p.startswith("modes.yaml:13: TenantMode needs a spec") for p in problems)


def test_duplicate_name_is_reported() -> None:
    _, problems = parse(
        "kind: TenantMode\nmetadata: {name: same}\nspec: {tenant: acme, mode: dry-run}\n---\n"
        "kind: TenantMode\nmetadata: {name: same}\nspec: {tenant: beta, mode: dry-run}\n"
    )
    assert len(problems) == 1
    assert "duplicate TenantMode name 'same'" in problems[0]
