"""Reading policy directories: YAML documents with the file and line of every node.

Owns file discovery (recursive, symlink loops broken, huge files refused), YAML
parsing, and the `Document` / `Problem` types every policy kind's validator uses.
Nothing here knows what a kind means.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 8 * 1024 * 1024
POLICY_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class Problem:
    """One validation problem, printed as `file:line: message`."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class Node(dict[str, Any]):
    """A YAML mapping that remembers its own line and the line of each key (1-based).
    Whoever builds one sets both (slots: a policy has hundreds of thousands)."""

    __slots__ = ("key_lines", "line")
    line: int
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class NodeList(list[Any]):
    """A YAML sequence that remembers its own line and the line of each item.
    Whoever builds one sets both."""

    __slots__ = ("item_lines", "line")
    line: int
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


def line_of(container: Any, key: str | int | None = None) -> int:
    """Best line for `container[key]` (or the container itself); 0 when unknown."""
    if isinstance(container, Node):
        return container.line_of(key) if isinstance(key, str) else container.line
    if isinstance(container, NodeList):
        return container.line_of(key) if isinstance(key, int) else container.line
    return 0


@dataclass(frozen=True, slots=True)
class Document:
    kind: str
    body: Node
    file: str
    line: int

    @property
    def name(self) -> str:
        meta = self.body.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        return name if isinstance(name, str) else ""

    def problem(self, message: str, node: Any = None, key: str | int | None = None) -> Problem:
        line = line_of(node, key) if node is not None else self.line
        return Problem(self.file, line or self.line, message)


@dataclass(frozen=True, slots=True)
class LoadResult:
    documents: list[Document]
    problems: list[Problem]
    revision: str


# PyYAML's libyaml binding (CSafeLoader) composes the nodes; PyYAML's safe constructor
# builds the values, with the constructors below in place of dict and list so every
# mapping and sequence keeps its lines. The pure-Python SafeLoader (same results, several
# times slower) is used only where PyYAML was built without libyaml.


_STR_TAG = "tag:yaml.org,2002:str"


def _construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """`loader.construct_object(node, deep=True)`, with a string (most of a policy's
    scalars) taken straight from its node: what the safe constructor would return, at a
    third of the cost."""
    if node.tag == _STR_TAG and type(node) is yaml.ScalarNode:
        return node.value
    return loader.construct_object(node, deep=True)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Node:
    loader.flatten_mapping(node)  # merge keys (<<)
    out = Node()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = _construct(loader, key_node)
        if not isinstance(key, str):
            key = str(key)
        if key in out:  # a duplicate key is a problem, never last-wins
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        out[key] = _construct(loader, value_node)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> NodeList:
    out = NodeList([_construct(loader, child) for child in node.value])
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


def _checked_scalar(
    tag: str, construct: Callable[[Any, yaml.ScalarNode], Any]
) -> Callable[[yaml.SafeLoader, yaml.ScalarNode], Any]:
    """`construct`, with a malformed value (`!!int abc`, a date like 2026-13-45) a YAML
    problem at its line instead of a ValueError quoting it."""
    what = tag.rsplit(":", 1)[-1]

    def checked(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        try:
            return construct(loader, node)
        except (ValueError, KeyError, OverflowError):
            raise yaml.constructor.ConstructorError(
                None, None, f"not a valid {what} value", node.start_mark
            ) from None

    return checked


def line_loader(base: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """`base` (a safe loader) reading mappings as `Node`s and sequences as `NodeList`s."""

    class LineLoader(base):  # type: ignore[valid-type,misc]
        pass

    LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)
    for name in ("bool", "int", "float", "timestamp"):
        tag = f"tag:yaml.org,2002:{name}"
        LineLoader.add_constructor(tag, _checked_scalar(tag, base.yaml_constructors[tag]))
    return LineLoader


_LineLoader = line_loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _complaint(exc: yaml.YAMLError) -> str:
    """What the parser says is wrong, never its snippet of the file (which may hold a
    secret): the same rule as `sidecar.core.redact.yaml_problem`."""
    what = getattr(exc, "problem", None) or getattr(exc, "context", None)
    what = what or getattr(exc, "reason", None) or "a syntax error"
    return str(what)[:120]


def parse_yaml_documents(text: str, file: str) -> tuple[list[Document], list[Problem]]:
    """Parse one file's text into documents; a YAML error is one problem for the file."""
    docs: list[Document] = []
    problems: list[Problem] = []
    try:
        values = _values(text)
    except RecursionError:
        return [], [Problem(file, 1, "not valid YAML: nested too deeply")]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        return [], [Problem(file, line, f"not valid YAML: {_complaint(exc)}")]
    except yaml.YAMLError as exc:
        return [], [Problem(file, 1, f"not valid YAML: {_complaint(exc)}")]
    for value, line in values:
        if value is None:
            continue
        if not isinstance(value, Node):
            problems.append(Problem(file, line, "a policy document must be a mapping"))
            continue
        kind = value.get("kind")
        if not isinstance(kind, str) or not kind:
            problems.append(Problem(file, line, "document has no 'kind'"))
            continue
        docs.append(Document(kind, value, file, line))
    return docs, problems


def _values(text: str, loader_class: type[yaml.SafeLoader] = _LineLoader) -> list[tuple[Any, int]]:
    """Each document's value and the line it starts on."""
    out: list[tuple[Any, int]] = []
    loader = loader_class(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                out.append((loader.construct_document(node), node.start_mark.line + 1))
    finally:
        loader.dispose()
    return out


def policy_files(paths: Sequence[str | Path]) -> tuple[list[Path], list[Problem]]:
    """Every *.yaml/*.yml under the given files/directories, sorted, loops broken."""
    found: list[Path] = []
    problems: list[Problem] = []
    for root in paths:
        root = Path(root)
        if root.is_file():
            found.append(root)
            continue
        if not root.is_dir():
            problems.append(Problem(str(root), 0, "no such policy file or directory"))
            continue
        seen: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen:
                dirnames[:] = []
                problems.append(Problem(dirpath, 0, "symlink loop skipped"))
                continue
            seen.add(real)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in sorted(filenames):
                if fn.endswith(POLICY_SUFFIXES) and not fn.startswith("."):
                    found.append(Path(dirpath) / fn)
    return sorted(set(found)), problems


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a policy is read or compiled.

    A 100k-line policy allocates about a million objects that all survive, enough to
    set off a dozen full collections, each scanning the whole heap: more than half of
    the load's time. A policy holds no reference cycles (tested), so nothing is lost:
    the collector looks at the new objects once it runs again. Leaves an already
    paused collector (the reloader's thread pauses it for the whole reload) paused."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def load_documents(paths: Sequence[str | Path]) -> LoadResult:
    """Read all policy files; problems never raise. The revision hashes each file's
    path relative to the policy directory it was found in (its name, for a file given
    directly) and its contents: the same tree gives the same revision wherever it is
    mounted and however its path is spelled (DESIGN §5)."""
    with collector_paused():
        return _load_documents(paths)


def _load_documents(paths: Sequence[str | Path]) -> LoadResult:
    files, problems = policy_files(paths)
    documents: list[Document] = []
    hashed: list[tuple[int, str, bytes]] = []
    for path in files:
        name = str(path)
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                problems.append(Problem(name, 0, f"file is larger than {MAX_FILE_BYTES} bytes"))
                continue
            raw = path.read_bytes()
        except OSError as exc:
            problems.append(Problem(name, 0, f"cannot read: {exc.strerror or exc}"))
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(Problem(name, 0, "file is not UTF-8 text"))
            continue
        hashed.append((*_relative_name(path, paths), raw))
        docs, probs = parse_yaml_documents(text, name)
        documents.extend(docs)
        problems.extend(probs)
    digest = hashlib.sha256()
    for _, rel, raw in sorted(hashed, key=lambda h: (h[0], h[1])):
        # Four updates hash what one update of the joined bytes did, without copying a
        # large file twice with the GIL held (hashing itself releases it).
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(raw)
        digest.update(b"\0")
    return LoadResult(documents, problems, digest.hexdigest()[:12])


def _relative_name(path: Path, roots: Sequence[str | Path]) -> tuple[int, str]:
    """(index of the root the file was found under, its path relative to that root,
    with '/' separators)."""
    for i, root in enumerate(roots):
        root = Path(root)
        if path == root:
            return i, path.name
        try:
            return i, path.relative_to(root).as_posix()
        except ValueError:
            continue
    return len(roots), path.name


def of_kind(documents: Iterable[Document], *kinds: str) -> list[Document]:
    return [d for d in documents if d.kind in kinds]
