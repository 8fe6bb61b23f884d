"""The import structure: no cycles between the sidecar's parts, and a backing store that
is a service of its own.

A "part" is a subpackage of `sidecar` (`sidecar.policy`, `sidecar.quota`, …) or a
module directly under it (`sidecar.context`, `sidecar.app`, …). Imports are read from
the source (module level and inside functions alike); imports under
`if TYPE_CHECKING:` are left out, since they never run. The store's Status bodies are
its own copy of the sidecar's (`backing_store/errors.py`), checked here to stay equal.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rigs import paths

ROOT = paths.ROOT


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Absolute names of every module imported at run time."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (name for child in node.orelse for name in _imports(child, module, False))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            yield prefix
            # `from sidecar import framing` imports the module sidecar.framing.
            yield from (f"{prefix}.{alias.name}" for alias in node.names)
        else:
            yield from _imports(node, module, is_package)


def import_graph(package: str) -> dict[str, set[str]]:
    """module → the modules of the project it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[name] = set(_imports(tree, name, path.name == "__init__.py"))
    return graph


def part_of(module: str) -> str:
    """`sidecar.policy.engine` → `sidecar.policy`; `sidecar.app` → `sidecar.app`."""
    return ".".join(module.split(".")[:2])


def part_graph() -> dict[str, set[str]]:
    modules = import_graph("sidecar")
    parts: dict[str, set[str]] = {}
    for module, imported in modules.items():
        if module == "sidecar":
            continue
        edges = parts.setdefault(part_of(module), set())
        for name in imported:
            if name in modules and name != "sidecar":
                edges.add(part_of(name))
    for part, edges in parts.items():
        edges.discard(part)
    return parts


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_imports_it_must() -> None:
    """The walker itself: a relative, an absolute, a function-level and a
    TYPE_CHECKING import."""
    parts = part_graph()
    assert "sidecar.policy" in parts["sidecar.quota"]  # quota enforces the policy's kinds
    assert "sidecar.quota" in parts["sidecar.app"]
    graph = import_graph("backing_store")
    assert "backing_store.errors" in graph["backing_store.app"]


def test_no_import_cycle_between_the_sidecars_parts() -> None:
    assert cycles(part_graph()) == []


def test_the_policy_package_imports_no_enforcing_package() -> None:
    """Quota and rate-limit policy kinds are parsed in `sidecar.policy`; the packages that
    enforce them depend on the policy, never the other way round."""
    parts = part_graph()
    assert not parts["sidecar.policy"] & {"sidecar.quota", "sidecar.ratelimit", "sidecar.identity"}


# The URL grammar of DESIGN §3 is still shared: `sidecar/target.py` imports only the
# standard library, and both must parse paths alike. It is the one import left; it goes
# when the grammar moves to a package of its own.
STORE_MAY_IMPORT = frozenset({"sidecar.target"})


def test_backing_store_imports_nothing_from_the_sidecar() -> None:
    offending = {
        module: sorted(
            n
            for n in names
            if (n == "sidecar" or n.startswith("sidecar."))
            and n not in STORE_MAY_IMPORT
            and n.rpartition(".")[0] not in STORE_MAY_IMPORT
        )
        for module, names in import_graph("backing_store").items()
    }
    assert {m: n for m, n in offending.items() if n} == {}


def test_the_shared_url_grammar_imports_only_the_standard_library() -> None:
    graph = import_graph("sidecar")
    assert {
        n for n in graph["sidecar.target"] if n.split(".")[0] in ("sidecar", "backing_store")
    } == set()


@pytest.mark.parametrize("code", [400, 404, 405, 409, 413, 415, 422, 500, 503])
def test_store_and_sidecar_status_bodies_are_the_same(code: int) -> None:
    from backing_store import errors as store
    from sidecar import errors as sidecar

    details = {"name": "x", "kind": "pods"}
    ours = sidecar.StatusError(code, "a message", details=details)
    theirs = store.StatusError(code, "a message", details=details)
    assert ours.body() == theirs.body()
    raw = theirs.response().body
    assert isinstance(raw, bytes)
    assert raw == ours.response().body
    assert json.loads(raw)["reason"] == sidecar.REASONS[code]


def test_store_and_sidecar_not_found_bodies_are_the_same() -> None:
    """A tenant the sidecar conceals gets exactly the 404 of an unknown tenant."""
    from backing_store import errors as store
    from sidecar import errors as sidecar

    assert sidecar.tenant_not_found("beta").body() == store.tenant_not_found("beta").body()
    assert sidecar.not_found("nodes", "n1").body() == store.not_found("nodes", "n1").body()
    assert sidecar.bad_request("no").body() == store.bad_request("no").body()
