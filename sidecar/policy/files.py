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
import re
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
            values = _values_from_lines(text)
        except (_Unsupported, RecursionError):
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
    implicit = _resolver.yaml_implicit_resolvers
    if value and not implicit.get(value[0]) and not implicit.get(None):
        return value  # no implicit type starts with this character (most names): a string
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


# -- the line path --------------------------------------------------------------------
# libyaml hands every event to Python as an event object with two marks: at 100k
# policy lines that is ~1.6M events, most of the load's time. Policy files are
# nearly always one simple shape: block mappings and sequences, one entry per line,
# plain or quoted one-line scalars, one-line flow collections, comments. The line path
# reads that shape straight from the text's lines, giving the same values and lines
# as the event path. It is deliberately narrow: anything outside the shape (tabs,
# non-ASCII, anchors, tags, block scalars, multi-line scalars or flows, escapes,
# complex keys, empty documents, duplicate keys, odd indentation, ...) raises
# _Unsupported and the file goes through the event path, which also reports errors.

# A plain scalar the line path accepts: letters, digits and a few safe characters, a
# ':' only inside it (followed by such a character), spaces only between such runs.
# It can never start with an indicator, nor contain ',[]{}#', so it means the same in
# block and flow context.
_PLAIN_START = r"[A-Za-z0-9_./~+]"
_PLAIN_CHAR = r"[A-Za-z0-9_./~+@$%^()=<>;-]"
_PLAIN = rf"(?:{_PLAIN_START}|-(?={_PLAIN_START})){_PLAIN_CHAR}*(?:(?::| +){_PLAIN_CHAR}+)*"
_SINGLE = r"'(?:[^']|'')*'"
_DOUBLE = r'"[^"\\]*"'
_SCALAR = rf"{_PLAIN}|{_SINGLE}|{_DOUBLE}"
# Indentation, "- " (a sequence entry), "key:" and the rest (maybe with a comment).
_LINE = re.compile(rf"( *)(- +)?(?:({_SCALAR}) *:(?= |$))? *(.*)")
_SCALAR_RE = re.compile(_SCALAR)
_PLAIN_RE = re.compile(_PLAIN)
_SINGLE_RE = re.compile(_SINGLE)
_DOUBLE_RE = re.compile(_DOUBLE)
# One-line flow collections of scalars (the common case), read with one findall.
_FLOW_SEQ = re.compile(rf"\[ *(?:(?:{_SCALAR}) *(?:, *(?:{_SCALAR}) *)*(?:, *)?)?\]")
_FLOW_MAP = re.compile(
    rf"\{{ *(?:(?:{_SCALAR}) *: +(?:{_SCALAR}) *(?:, *(?:{_SCALAR}) *: +(?:{_SCALAR}) *)*"
    rf"(?:, *)?)?\}}"
)
_FLOW_PAIR = re.compile(rf"({_SCALAR}) *: +({_SCALAR})")
# Anything but printable ASCII (tabs, carriage returns, control characters, any
# non-ASCII text) goes through libyaml.
_UNSAFE = re.compile(r"[^\x20-\x7e]")

# What one distinct line holds: (indentation, width of its "- " or 0, its key or None,
# how its value is built, the value's template). Policy files repeat most of their
# lines (keys, verbs, resources, role references), so each distinct line is matched
# once per file and its values are copied from the template after that.
_Shape = tuple[int, int, "str | None", int, Any]
_SKIP: _Shape = (-1, 0, None, 0, None)  # a blank or comment line
_DOCUMENT_START: _Shape = (-2, 0, None, 0, None)  # "---"
# How a value is built from its template.
_NO_VALUE = 0  # nothing after "key:" or "- ": a nested block, or null
_SCALAR_VALUE = 1  # the template is the value
_FLAT_SEQUENCE = 2  # a tuple of scalars
_FLAT_MAPPING = 3  # a dict of scalars
_NESTED_FLOW = 4  # the line's text, parsed each time
_NULL = _plain("")
_MISSING = object()
# Distinct lines (and scalars, and keys) remembered per file: a file whose lines hardly
# repeat gains nothing from more, and they would only cost memory.
_CACHED_PER_FILE = 1 << 16


def _values_from_lines(text: str) -> list[tuple[Any, int]]:
    if not text.isascii():
        raise _Unsupported("characters outside ASCII")
    reader = _LineReader()
    try:
        return reader.read(text)
    finally:
        reader.release()


def _split_lines(text: str, chunk: int = 1 << 16) -> Iterator[str]:
    """The lines of `text` (split at line feeds), split a chunk at a time: splitting a
    7 MB policy file at once is one C call of ~20 ms, all of it with the GIL held (an
    event loop stall while the reloader loads)."""
    start = 0
    while True:
        end = text.find("\n", start + chunk)
        if end < 0:
            yield from text[start:].split("\n")
            return
        yield from text[start:end].split("\n")
        start = end + 1


class _LineReader:
    """Builds the values of one file's documents from the shapes of their lines."""

    def __init__(self) -> None:
        self.known: dict[str, _Shape] = {}
        self.scalars: dict[str, Any] = {}
        self.keys: dict[str, str] = {}
        self.numbers: list[int] = []
        self.shapes: list[_Shape] = []

    def read(self, text: str) -> list[tuple[Any, int]]:
        known = self.known
        shape_of = self.shape
        out: list[tuple[Any, int]] = []
        numbers: list[int] = []
        shapes: list[_Shape] = []
        explicit = False  # the current document was opened by "---"
        for number, line in enumerate(_split_lines(text), 1):
            shape = known.get(line) or shape_of(line)
            if shape[0] < 0:
                if shape is _SKIP:
                    continue
                if shapes:
                    out.append(self.document(numbers, shapes))
                    numbers, shapes = [], []
                elif explicit:
                    raise _Unsupported("an empty document")
                explicit = True
                continue
            numbers.append(number)
            shapes.append(shape)
        if shapes:
            out.append(self.document(numbers, shapes))
        elif explicit:
            raise _Unsupported("an empty document")
        return out

    def release(self) -> None:
        """Empty the caches an entry at a time. Dropped at once, a large file's caches
        are one deallocation cascade, ~10 ms with the GIL held: the event loop would
        stall that long while the reloader loads."""
        for cache in (self.known, self.scalars, self.keys):
            while cache:
                cache.popitem()

    # -- lines --------------------------------------------------------------------------

    def shape(self, line: str) -> _Shape:
        content = line.lstrip(" ")
        if _UNSAFE.search(line):
            raise _Unsupported("characters outside printable ASCII")
        if not content or content[0] == "#":
            shape = _SKIP
        elif line[:3] == "---" and line.rstrip(" ") == "---":
            shape = _DOCUMENT_START
        elif "#" not in content:
            shape = self.entry(line, comment=False)
        else:
            # A '#' inside a quoted scalar is text: when the whole rest of the line
            # reads as a value, that is what it is; otherwise a " #" starts a comment.
            try:
                shape = self.entry(line, comment=False)
            except _Unsupported:
                shape = self.entry(line, comment=True)
        if len(self.known) < _CACHED_PER_FILE:
            self.known[line] = shape
        return shape

    def entry(self, line: str, comment: bool) -> _Shape:
        m = _LINE.match(line)
        if m is None:
            raise _Unsupported("an unusual line")
        indent, dash, raw_key, raw = m.groups()
        if comment:
            # `raw` follows "- " or ": " (spaces taken) or is the whole line's content
            # (which is not a comment): a '#' at its start, or after a space, opens one.
            start = 0 if raw[:1] == "#" else raw.find(" #")
            if start >= 0:
                raw = raw[:start]
        raw = raw.rstrip(" ")
        key = self.key(raw_key) if raw_key is not None else None
        build, template = self.template(raw) if raw else (_NO_VALUE, None)
        return (len(indent), len(dash) if dash else 0, key, build, template)

    def key(self, raw: str) -> str:
        key = self.keys.get(raw)
        if key is None:
            value = self.scalar(raw)
            key = value if isinstance(value, str) else str(value)
            if len(self.keys) < _CACHED_PER_FILE:
                self.keys[raw] = key
        return key

    def scalar(self, raw: str) -> Any:
        """A scalar token (already matched by _SCALAR) as its value."""
        value = self.scalars.get(raw, _MISSING)
        if value is _MISSING:
            first = raw[0]
            if first == "'":
                value = raw[1:-1].replace("''", "'")
            elif first == '"':
                value = raw[1:-1]
            else:
                value = _plain(raw)
            if len(self.scalars) < _CACHED_PER_FILE:
                self.scalars[raw] = value
        return value

    def template(self, raw: str) -> tuple[int, Any]:
        first = raw[0]
        if first == "[":
            if _FLOW_SEQ.fullmatch(raw):
                return _FLAT_SEQUENCE, tuple(map(self.scalar, _SCALAR_RE.findall(raw)))
            self.flow(raw, 0)  # raises now if the line path cannot read it
            return _NESTED_FLOW, raw
        if first == "{":
            if _FLOW_MAP.fullmatch(raw):
                pairs = _FLOW_PAIR.findall(raw)
                mapping = {self.key(k): self.scalar(v) for k, v in pairs}
                if len(mapping) != len(pairs):
                    raise _Unsupported("duplicate key")
                return _FLAT_MAPPING, mapping
            self.flow(raw, 0)
            return _NESTED_FLOW, raw
        if first == "'":
            matched = _SINGLE_RE.fullmatch(raw)
        elif first == '"':
            matched = _DOUBLE_RE.fullmatch(raw)
        else:
            matched = _PLAIN_RE.fullmatch(raw)
        if matched is None:
            raise _Unsupported("an unusual scalar")
        return _SCALAR_VALUE, self.scalar(raw)

    def value(self, build: int, template: Any, line: int) -> Any:
        if build == _SCALAR_VALUE:
            return template
        if build == _FLAT_SEQUENCE:
            seq = NodeList(template)
            seq.line = line
            seq.item_lines = [line] * len(template)
            return seq
        if build == _FLAT_MAPPING:
            node = Node(template)
            node.line = line
            node.key_lines = dict.fromkeys(template, line)
            return node
        return self.flow(template, line)

    # -- blocks -------------------------------------------------------------------------

    def document(self, numbers: list[int], shapes: list[_Shape]) -> tuple[Any, int]:
        first = shapes[0]
        if first[0] or first[1] or first[2] is None:
            raise _Unsupported("the document is not a block mapping")
        self.numbers = numbers
        self.shapes = shapes
        node, end = self.mapping(0, 0)
        if end != len(shapes):
            raise _Unsupported("content after the document's mapping")
        return node, numbers[0]

    def block(self, i: int) -> tuple[Any, int]:
        shape = self.shapes[i]
        if shape[1]:
            return self.sequence(i, shape[0])
        if shape[2] is not None:
            return self.mapping(i, shape[0])
        raise _Unsupported("a multi-line scalar")

    def mapping(self, i: int, col: int) -> tuple[Node, int]:
        """The block mapping whose keys are at column `col`, from line `i` (which may be
        a sequence entry "- key: ...": its "- " is the sequence's)."""
        numbers = self.numbers
        shapes = self.shapes
        count = len(shapes)
        shape = shapes[i]
        node = Node()
        node.line = numbers[i]
        key_lines: dict[str, int] = {}
        node.key_lines = key_lines
        while True:
            _, _, key, build, template = shape
            if key is None:
                raise _Unsupported("a scalar where a key was expected")
            if key in node:
                raise _Unsupported("duplicate key")
            line = numbers[i]
            i += 1
            value: Any
            if build == _SCALAR_VALUE:
                value = template
            elif build:
                value = self.value(build, template, line)
            elif i < count and shapes[i][0] > col:
                value, i = self.block(i)
            elif i < count and shapes[i][0] == col and shapes[i][1]:
                value, i = self.sequence(i, col)  # an indentless sequence
            else:
                value = _NULL
            node[key] = value
            key_lines[key] = line
            if i == count:
                return node, i
            shape = shapes[i]
            if shape[0] < col:
                return node, i
            if shape[0] > col or shape[1]:
                raise _Unsupported("unexpected indentation")

    def sequence(self, i: int, col: int) -> tuple[NodeList, int]:
        """The block sequence whose "- " entries are at column `col`, from line `i`."""
        numbers = self.numbers
        shapes = self.shapes
        count = len(shapes)
        shape = shapes[i]
        out = NodeList()
        out.line = numbers[i]
        item_lines: list[int] = []
        out.item_lines = item_lines
        while True:
            _, dash, key, build, template = shape
            line = numbers[i]
            value: Any
            if key is not None:
                value, i = self.mapping(i, col + dash)
            elif build:
                value = self.value(build, template, line)
                i += 1
            else:
                raise _Unsupported("an empty or nested sequence entry")
            out.append(value)
            item_lines.append(line)
            if i == count:
                return out, i
            shape = shapes[i]
            if shape[0] > col:
                raise _Unsupported("unexpected indentation")
            if shape[0] < col or not shape[1]:
                return out, i

    # -- flow collections with nested collections ---------------------------------------

    def flow(self, raw: str, line: int) -> Any:
        try:
            value, end = self.flow_item(raw, 0, line)
        except IndexError:  # ran off the line: the collection goes on below
            raise _Unsupported("a multi-line flow collection") from None
        if end != len(raw):
            raise _Unsupported("text after a flow collection")
        return value

    def flow_item(self, raw: str, pos: int, line: int) -> tuple[Any, int]:
        first = raw[pos]
        if first == "[":
            seq = NodeList()
            seq.line = line
            item_lines: list[int] = []
            seq.item_lines = item_lines
            pos = _skip_spaces(raw, pos + 1)
            while raw[pos] != "]":
                value, pos = self.flow_item(raw, pos, line)
                seq.append(value)
                item_lines.append(line)
                pos = _skip_spaces(raw, pos)
                if raw[pos] == ",":
                    pos = _skip_spaces(raw, pos + 1)
                elif raw[pos] != "]":
                    raise _Unsupported("unexpected text in a flow sequence")
            return seq, pos + 1
        if first == "{":
            node = Node()
            node.line = line
            key_lines: dict[str, int] = {}
            node.key_lines = key_lines
            pos = _skip_spaces(raw, pos + 1)
            while raw[pos] != "}":
                m = _SCALAR_RE.match(raw, pos)
                if m is None:
                    raise _Unsupported("an unusual flow mapping key")
                key = self.key(m.group())
                if key in node:
                    raise _Unsupported("duplicate key")
                pos = _skip_spaces(raw, m.end())
                if raw[pos] != ":" or raw[pos + 1] != " ":
                    raise _Unsupported("a flow mapping entry without ': '")
                value, pos = self.flow_item(raw, _skip_spaces(raw, pos + 1), line)
                node[key] = value
                key_lines[key] = line
                pos = _skip_spaces(raw, pos)
                if raw[pos] == ",":
                    pos = _skip_spaces(raw, pos + 1)
                elif raw[pos] != "}":
                    raise _Unsupported("unexpected text in a flow mapping")
            return node, pos + 1
        m = _SCALAR_RE.match(raw, pos)
        if m is None:
            raise _Unsupported("an unusual flow scalar")
        return self.scalar(m.group()), m.end()


def _skip_spaces(raw: str, pos: int) -> int:
    while raw[pos] == " ":
        pos += 1
    return pos


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
