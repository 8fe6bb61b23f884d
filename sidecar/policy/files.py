"""Reading policy directories: YAML documents with the file and line of every node.

Owns file discovery (recursive, symlink loops broken, huge files refused), YAML
parsing, and the `Document` / `Problem` types every policy kind's validator uses.
Nothing here knows what a kind means.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
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
    """A YAML mapping that remembers its own line and the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class NodeList(list[Any]):
    """A YAML sequence that remembers its own line and the line of each item."""

    line: int = 0
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


# libyaml's parser is ~10x faster than the pure-Python one on large policy sets.
_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LineLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> Node:
    loader.flatten_mapping(node)
    out = Node()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            key = str(key)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> NodeList:
    out = NodeList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def parse_yaml_documents(text: str, file: str) -> tuple[list[Document], list[Problem]]:
    """Parse one file's text into documents; a YAML error is one problem for the file."""
    docs: list[Document] = []
    problems: list[Problem] = []
    try:
        try:
            values = _values_from_events(text)
        except _Unsupported:
            values = _values_from_nodes(text)
    except RecursionError:
        return [], [Problem(file, 1, "not valid YAML: nested too deeply")]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        return [], [Problem(file, line, f"not valid YAML: {exc.problem or exc}")]
    except yaml.YAMLError as exc:
        return [], [Problem(file, 1, f"not valid YAML: {exc}")]
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


def _values_from_nodes(text: str) -> list[tuple[Any, int]]:
    """The general path: libyaml composes nodes, PyYAML constructs them."""
    out: list[tuple[Any, int]] = []
    loader = _LineLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                out.append((loader.construct_document(node), node.start_mark.line + 1))
    finally:
        loader.dispose()
    return out


# -- the fast path --------------------------------------------------------------------
# Building values straight from libyaml's events skips the ~1M intermediate node
# objects of a large policy set (3x faster at 100k policy lines). It gives the same
# values and lines as the node path; anything unusual (merge keys, non-core tags)
# raises _Unsupported and the file goes through the node path instead.

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAGS = (None, "!", yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG)
_SEQ_TAGS = (None, "!", yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG)
_SCALAR_TAGS = frozenset(
    "tag:yaml.org,2002:" + t for t in ("null", "bool", "int", "float", "timestamp")
)
_resolver = yaml.resolver.Resolver()
_constructor = yaml.constructor.SafeConstructor()
_plain_cache: dict[str, Any] = {}


_ScalarEvent = yaml.ScalarEvent
_MappingStart = yaml.MappingStartEvent
_MappingEnd = yaml.MappingEndEvent
_SequenceStart = yaml.SequenceStartEvent
_SequenceEnd = yaml.SequenceEndEvent
_AliasEvent = yaml.AliasEvent


class _Unsupported(Exception):
    pass


def _typed(tag: str, value: str) -> Any:
    if tag == _STR_TAG:
        return value
    if tag not in _SCALAR_TAGS:
        raise _Unsupported(tag)
    node = yaml.ScalarNode(tag, value)
    return _constructor.yaml_constructors[tag](_constructor, node)


def _plain(value: str) -> Any:
    try:
        return _plain_cache[value]
    except KeyError:
        pass
    tag = _resolver.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    result = _typed(tag, value)
    if len(_plain_cache) > 50000:
        _plain_cache.clear()
    _plain_cache[value] = result
    return result


def _values_from_events(text: str) -> list[tuple[Any, int]]:
    loader = _BaseLoader(text)
    out: list[tuple[Any, int]] = []
    try:
        get: Callable[[], Any] = loader.get_event
        get()  # StreamStart
        while not isinstance(get(), yaml.StreamEndEvent):
            root = get()  # the event after DocumentStart
            anchors: dict[str, Any] = {}
            out.append((_event_value(get, root, anchors), root.start_mark.line + 1))
            get()  # DocumentEnd
    finally:
        loader.dispose()
    return out


def _event_value(get: Callable[[], Any], event: Any, anchors: dict[str, Any]) -> Any:
    kind = type(event)
    value: Any
    if kind is _ScalarEvent:
        tag = event.tag
        if tag is None or tag == "!":
            value = _plain(event.value) if event.implicit[0] else event.value
        else:
            value = _typed(tag, event.value)
    elif kind is _MappingStart:
        if event.tag not in _MAP_TAGS:
            raise _Unsupported(event.tag)
        value = Node()
        value.line = event.start_mark.line + 1
        key_lines: dict[str, int] = {}
        value.key_lines = key_lines
        if event.anchor:
            anchors[event.anchor] = value
        while type(key_event := get()) is not _MappingEnd:
            key = _event_value(get, key_event, anchors)
            if key == "<<" and type(key_event) is _ScalarEvent and key_event.implicit[0]:
                raise _Unsupported("merge key")
            if not isinstance(key, str):
                key = str(key)
            if key in value:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_event.start_mark
                )
            value[key] = _event_value(get, get(), anchors)
            key_lines[key] = key_event.start_mark.line + 1
        return value
    elif kind is _SequenceStart:
        if event.tag not in _SEQ_TAGS:
            raise _Unsupported(event.tag)
        value = NodeList()
        value.line = event.start_mark.line + 1
        item_lines: list[int] = []
        value.item_lines = item_lines
        if event.anchor:
            anchors[event.anchor] = value
        while type(item_event := get()) is not _SequenceEnd:
            item_lines.append(item_event.start_mark.line + 1)
            value.append(_event_value(get, item_event, anchors))
        return value
    elif kind is _AliasEvent:
        if event.anchor not in anchors:
            raise yaml.composer.ComposerError(
                None, None, f"found undefined alias {event.anchor!r}", event.start_mark
            )
        return anchors[event.anchor]
    else:
        raise _Unsupported(kind.__name__)
    if event.anchor:
        anchors[event.anchor] = value
    return value


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


def load_documents(paths: Sequence[str | Path]) -> LoadResult:
    """Read all policy files; problems never raise. The revision hashes each file's
    path relative to the policy directory it was found in (its name, for a file given
    directly) and its contents: the same tree gives the same revision wherever it is
    mounted and however its path is spelled (DESIGN §5)."""
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
        digest.update(rel.encode() + b"\0" + raw + b"\0")
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
