"""The import structure: no cycles between the sidecar's parts, and a backing store that
is a service of its own.

A "part" is a subpackage of `sidecar` (`sidecar.policy`, `sidecar.pipeline`, …) or a
module directly under it (`sidecar.app`). The parts are layers (DESIGN §2, listed in
`LAYERS` lowest first): a part imports only from the parts above it in the list. Imports are read from
the source (module level and inside functions alike); imports under
`if TYPE_CHECKING:` are left out, since they never run. The store's Status bodies are
its own copy of the sidecar's (`backing_store/errors.py`), checked here to stay equal.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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


def _imports(
    tree: ast.AST,
    module: str,
    is_package: bool,
    *,
    type_checking: bool = False,
    module_level: bool = False,
) -> Iterator[str]:
    """Absolute names of every module imported at run time (with `type_checking`, the
    imports under `if TYPE_CHECKING:` too; with `module_level`, not those in functions)."""

    def inner(node: ast.AST) -> Iterator[str]:
        yield from _imports(
            node, module, is_package, type_checking=type_checking, module_level=module_level
        )

    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            chosen = [*node.body, *node.orelse] if type_checking else node.orelse
            yield from inner(ast.Module(body=chosen, type_ignores=[]))
            continue
        if module_level and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
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
            yield from inner(node)


def import_graph(
    package: str, *, type_checking: bool = False, module_level: bool = False
) -> dict[str, set[str]]:
    """module → the modules of the project it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = _imports(
            tree,
            name,
            path.name == "__init__.py",
            type_checking=type_checking,
            module_level=module_level,
        )
        graph[name] = set(found)
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
    assert "sidecar.policy" in parts["sidecar.pipeline"]  # the stages enforce the policy
    assert "sidecar.services" in parts["sidecar.app"]
    typed = import_graph("sidecar", type_checking=True)
    assert "sidecar.policy.source.bundle" in typed["sidecar.pipeline.context"]
    top = import_graph("sidecar", type_checking=True, module_level=True)
    assert "sidecar.app" in import_graph("sidecar")["sidecar.cli.main"]
    assert "sidecar.app" not in top["sidecar.cli.main"]  # imported inside a function
    graph = import_graph("backing_store")
    assert "backing_store.errors" in graph["backing_store.app"]


def test_no_import_cycle_between_the_sidecars_parts() -> None:
    assert cycles(part_graph()) == []


def test_the_policy_package_imports_no_enforcing_package() -> None:
    """Quota and rate-limit policy kinds are parsed in `sidecar.policy`; the packages that
    enforce them depend on the policy, never the other way round."""
    parts = part_graph()
    assert not parts["sidecar.policy"] & {"sidecar.services", "sidecar.pipeline", "sidecar.edge"}


# The URL grammar of DESIGN §3 is still shared: `sidecar/core/target.py` imports only the
# standard library, and both must parse paths alike. It is the one import left; it goes
# when the grammar moves to a package of its own.
STORE_MAY_IMPORT = frozenset({"sidecar.core.target"})


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
        n for n in graph["sidecar.core.target"] if n.split(".")[0] in ("sidecar", "backing_store")
    } == set()


@pytest.mark.parametrize("code", [400, 404, 405, 409, 413, 415, 422, 500, 503])
def test_store_and_sidecar_status_bodies_are_the_same(code: int) -> None:
    from backing_store import errors as store
    from sidecar.core import status as sidecar
    from sidecar.wire.status import response

    details = {"name": "x", "kind": "pods"}
    ours = sidecar.StatusError(code, "a message", details=details)
    theirs = store.StatusError(code, "a message", details=details)
    assert ours.body() == theirs.body()
    raw = theirs.response().body
    assert isinstance(raw, bytes)
    assert raw == response(ours).body
    assert json.loads(raw)["reason"] == sidecar.REASONS[code]


def test_store_and_sidecar_not_found_bodies_are_the_same() -> None:
    """A tenant the sidecar conceals gets exactly the 404 of an unknown tenant."""
    from backing_store import errors as store
    from sidecar.core import status as sidecar

    assert sidecar.tenant_not_found("beta").body() == store.tenant_not_found("beta").body()
    assert sidecar.not_found("nodes", "n1").body() == store.not_found("nodes", "n1").body()
    assert sidecar.bad_request("no").body() == store.bad_request("no").body()


# DESIGN §2, lowest first: each part imports only from the parts listed before it (and
# from itself), at module level, inside functions and under TYPE_CHECKING alike.
LAYERS = (
    "sidecar.core",
    "sidecar.config",
    "sidecar.policy",
    "sidecar.wire",
    "sidecar.upstream",
    "sidecar.services",
    "sidecar.pipeline",
    "sidecar.edge",
    "sidecar.app",
    "sidecar.cli",
)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a part listed after the importer's part."""
    rank = {part: n for n, part in enumerate(LAYERS)}
    found = []
    for module, imported in sorted(graph.items()):
        if module == "sidecar":
            continue
        mine = rank[part_of(module)]
        for name in sorted(imported):
            if name in graph and name != "sidecar" and rank[part_of(name)] > mine:
                found.append(f"{module} imports {name}")
    return found


def test_every_part_of_the_sidecar_is_a_layer() -> None:
    parts = {part_of(m) for m in import_graph("sidecar") if m != "sidecar"}
    assert parts == set(LAYERS)


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {"sidecar.core.target": {"sidecar.pipeline.context"}, "sidecar.pipeline.context": set()}
    assert layer_violations(graph) == ["sidecar.core.target imports sidecar.pipeline.context"]


def test_each_layer_imports_only_the_layers_above_it() -> None:
    assert layer_violations(import_graph("sidecar", type_checking=True)) == []


def test_no_import_cycle_between_the_sidecars_modules() -> None:
    """Module level, TYPE_CHECKING imports included (imports inside functions, which run
    after every module is loaded, are left out)."""
    graph = import_graph("sidecar", type_checking=True, module_level=True)
    assert cycles(graph) == []


@pytest.mark.parametrize(
    "module",
    [
        "sidecar.policy.decide",
        "sidecar.policy.tools.explain",
        "sidecar.policy.tools.checks",
        "sidecar.policy.tools.testing",
        "sidecar.policy.tools.diff",
        "sidecar.policy.tools.whocan",
        "sidecar.policy.source.bundle",
    ],
)
def test_the_decision_and_the_policy_tools_load_without_aiohttp(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('aiohttp')))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
