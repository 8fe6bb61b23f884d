"""Writes carry the state they were decided on (issue 28; DESIGN §1, §7, §8).

An update, patch or apply that the sidecar decides on a state of the object (its charge
from the upstream's `dryRun=All` answer, or its owner read fresh from the store) is
sent for real with that state as a precondition, so the upstream refuses it (409, or
422 for a failed JSON patch `test` on some upstreams) when the object changed in
between, instead of applying the write to a state nobody decided on:

- a JSON patch gets a leading `test` operation on `/metadata/resourceVersion`;
- a PUT, merge patch, strategic merge patch or server-side apply gets
  `metadata.resourceVersion` in its body;
- an apply that creates the object (the dry run found none: no resourceVersion) gets
  the dry run's `metadata.uid` instead: if another object of that name appears in
  between, the upstream refuses the apply (the uid is not its), and a create ignores a
  client's uid.

The body is read once (`read_write_body`) as the upstream reads it (JSON for PUT and
the JSON patch types; JSON or YAML for apply) and re-encoded as JSON, both for the dry
run and for the real write, so the two differ only by the precondition: the decision
and the write read the same bytes. A body the sidecar cannot read that way (another
`Content-Type`, any `Content-Encoding`, bytes that are not JSON or YAML, a number JSON
cannot carry, `metadata` that is not an object) is a 4xx Status before anything is sent.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any

import yaml

from sidecar.core import strict_json
from sidecar.core.status import StatusError, bad_request

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_PATCH_TYPES = frozenset({JSON, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH})
# Nesting deeper than this is refused (the reference store's own bound).
MAX_DEPTH = 100
# How many times a write decided on a state is tried before the client gets 409.
MAX_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class DecidedState:
    """The state of the object a write was decided on: its `resourceVersion` ("" when
    it did not exist: the write creates it) and its `uid`."""

    resource_version: str
    uid: str

    @staticmethod
    def of(obj: Any) -> DecidedState | None:
        """The state an object (a dry run's answer, a fresh read) shows; None when it
        names neither a resourceVersion nor a uid (nothing to hold the write to)."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            return None
        rv, uid = meta.get("resourceVersion"), meta.get("uid")
        rv = rv if isinstance(rv, str) else ""
        uid = uid if isinstance(uid, str) else ""
        return DecidedState(rv, uid) if rv or uid else None


def conflict(resource: str, name: str, attempts: int) -> StatusError:
    """The 409 for a write whose object kept changing between decision and write."""
    return StatusError(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": the object changed while '
        f"this write was being decided ({attempts} attempts); please retry",
        reason="Conflict",
        details={"name": name, "kind": resource},
    )


class StateChanged(StatusError):
    """The object changed after an earlier stage decided on it (its owner): that stage
    decides again, or the client gets this 409."""


@dataclass(frozen=True, slots=True)
class WriteBody:
    """A write's body as the upstream reads it: `kind` is `put`, `json-patch`, `merge`
    (merge or strategic merge) or `apply`."""

    kind: str
    value: Any

    def plain(self) -> bytes:
        """The body re-encoded, without a precondition (for the dry run)."""
        return _encode(self.value)

    def with_state(self, state: DecidedState | None) -> bytes:
        """The body holding `state` as its precondition (`plain` for None)."""
        if state is None:
            return self.plain()
        if self.kind == "json-patch":
            ops: list[Any] = []
            rv = state.resource_version
            if rv:
                ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": rv})
            elif state.uid:
                ops.append({"op": "test", "path": "/metadata/uid", "value": state.uid})
            return _encode([*ops, *self.value])
        doc = copy.copy(self.value)
        meta = dict(doc.get("metadata") or {})
        if state.resource_version:
            _agree(meta, "resourceVersion", state.resource_version)
            meta["resourceVersion"] = state.resource_version
        elif state.uid:
            _agree(meta, "uid", state.uid)
            meta["uid"] = state.uid
        doc["metadata"] = meta
        return _encode(doc)

    @property
    def changed_statuses(self) -> frozenset[int]:
        """The answers to a real write (after its dry run passed) that say the object
        changed: 409, and 422 for a JSON patch `test` or an apply's uid (Kubernetes
        answers those 422)."""
        if self.kind in ("json-patch", "apply"):
            return frozenset({409, 422})
        return frozenset({409})


def held_delete_options(raw: bytes, state: DecidedState) -> bytes:
    """A DELETE's DeleteOptions (its body, or a new one when it has none) holding
    `state` in `preconditions`; 400 for a body that is not a JSON object."""
    options: Any = {"kind": "DeleteOptions", "apiVersion": "v1"}
    if raw.strip():
        try:
            options = strict_json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise bad_request("a DELETE body must be a DeleteOptions JSON object") from None
        if not isinstance(options, dict):
            raise bad_request("a DELETE body must be a DeleteOptions JSON object")
        _check_depth(options)
    given = options.get("preconditions")
    if given is not None and not isinstance(given, dict):
        raise bad_request("DeleteOptions.preconditions must be an object")
    held = dict(given or {})
    if state.resource_version:
        _agree(held, "resourceVersion", state.resource_version)
        held["resourceVersion"] = state.resource_version
    if state.uid:
        _agree(held, "uid", state.uid)
        held["uid"] = state.uid
    return _encode({**options, "preconditions": held})


def _agree(given: dict[str, Any], field: str, decided: str) -> None:
    """A client's own precondition (`field` in its body) must be the decided one: when
    they differ, one of them is stale, and both must hold, so the object is read again
    (StateChanged: decided again, or 409 when it keeps differing)."""
    own = given.get(field)
    if own not in (None, "") and str(own) != decided:
        raise StateChanged(
            409, f"the request's own {field} precondition is not the object's current one"
        )


def _encode(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate (`"\ud800"` in the JSON): kept escaped
        return json.dumps(value, separators=(",", ":")).encode()


def body_kind(method: str, content_type: str) -> str:
    """How the upstream reads a write's body (415 for a type it reads no other way)."""
    if method == "PUT":
        if content_type not in (JSON, "application/octet-stream"):
            raise _unsupported(content_type)
        return "put"
    if content_type not in _PATCH_TYPES and content_type != "application/octet-stream":
        raise _unsupported(content_type)
    if content_type == JSON_PATCH:
        return "json-patch"
    if content_type == APPLY_PATCH:
        return "apply"
    return "merge"


def _unsupported(content_type: str) -> StatusError:
    return StatusError(
        415,
        "the sidecar must read this write's body to hold it to the state it was decided "
        f"on, and reads JSON (or YAML for server-side apply) only, not {content_type[:80]!r}",
    )


def parse_write_body(method: str, content_type: str, encoding: str, raw: bytes) -> WriteBody:
    """`raw` read as the upstream reads a body of this method and type (see the module
    docstring); 415 for a type or encoding it cannot read, 400 for bad bytes."""
    encoding = encoding.strip().lower()
    if encoding and encoding != "identity":
        raise StatusError(
            415,
            f"the sidecar must read this request body and accepts no Content-Encoding "
            f"(got {encoding[:40]!r}); send it uncompressed",
        )
    kind = body_kind(method, content_type)
    if not raw.strip():
        raise bad_request("the request needs a body")
    try:
        value = strict_json.loads(raw)
    except strict_json.NotJsonNumber as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        if kind != "apply":
            raise bad_request("the request body is not valid JSON") from None
        value = _load_yaml(raw, len(raw))
    _check_depth(value)
    if kind == "json-patch":
        if not isinstance(value, list):
            raise bad_request("a JSON patch must be a JSON array of operations")
        return WriteBody(kind, value)
    if not isinstance(value, dict):
        raise bad_request("the request body must be a JSON object")
    if "metadata" in value and not isinstance(value["metadata"], dict):
        raise bad_request("metadata must be an object")
    return WriteBody(kind, value)


def _check_depth(value: Any) -> None:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_DEPTH:
                raise bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels")
            items = node.values() if isinstance(node, dict) else node
            stack.extend((item, depth + 1) for item in items)


# -- server-side apply bodies in YAML ---------------------------------------------------

_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _ApplyLoader(_SafeLoader):  # type: ignore[misc]
    """Safe YAML without the timestamp type (a date is a string in JSON), as the
    reference store (and sigs.k8s.io/yaml) read an apply body."""


_ApplyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load_yaml(raw: bytes, budget: int) -> Any:
    try:
        loaded = yaml.load(raw.decode("utf-8"), Loader=_ApplyLoader)
        return _as_json(loaded, 0, [budget])
    except UnicodeDecodeError:
        raise bad_request("the apply body is not UTF-8") from None
    except yaml.YAMLError:
        raise bad_request("the apply body is not valid YAML or JSON") from None
    except RecursionError:
        raise bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # an integer beyond Python's own limit of digits
        raise bad_request("the apply body holds a number JSON cannot carry") from None


def _as_json(value: Any, depth: int, budget: list[int]) -> Any:
    """A YAML document as JSON values: text keys, finite numbers, no binary or dates;
    at most one value per byte of the body (aliases expanding it are refused)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise bad_request("the apply body expands to more values than its size allows")
    if depth > MAX_DEPTH:
        raise bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        return {_key_text(k): _as_json(v, depth + 1, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v, depth + 1, budget) for v in value]
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int | float):
        try:
            if math.isfinite(float(value)):
                return value
        except OverflowError:
            pass
        raise bad_request("the apply body holds a number JSON cannot carry")
    raise bad_request(f"the apply body holds a YAML {type(value).__name__}, not a JSON value")


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, int | float):
        return str(key)
    raise bad_request("the apply body has a map key that is not a scalar")
