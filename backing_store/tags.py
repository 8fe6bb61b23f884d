"""Nova-style tags on `servers` (DESIGN §10): validation, the tags subresource, filters.

Status codes follow the Nova spec: PUT one tag 201 (new) / 204 (already there, even at
the limit); GET one 204/404; DELETE one 204/404; DELETE all 204; PUT all replaces and
returns `{"tags": [...]}`. Tags are case-sensitive strings of 1..60 UTF-8 bytes without
`/` or `,`, at most 50 per server.

List filters are SQL over the `tags` table, with the design's semantics (which differ
from Nova's shipped code for the two `not-` filters):
`tags=a,b` has both; `tags-any=a,b` has at least one; `not-tags=a,b` has neither;
`not-tags-any=a,b` lacks at least one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from .bodies import json_response, read_json
from .errors import StatusError, bad_request, not_found
from .storage import Clause, Store

MAX_TAGS = 50
MAX_TAG_BYTES = 60
FILTERS = ("tags", "tags-any", "not-tags", "not-tags-any")


def validate_tag(tag: object) -> str:
    if not isinstance(tag, str):
        raise bad_request(f"a tag must be a string, not {type(tag).__name__}")
    if not tag:
        raise bad_request("a tag must not be empty")
    if len(tag.encode("utf-8", "surrogatepass")) > MAX_TAG_BYTES:
        raise bad_request(f"tag {tag[:20]!r}... is longer than {MAX_TAG_BYTES} bytes of UTF-8")
    if "/" in tag or "," in tag:
        raise bad_request(f"tag {tag!r} must not contain '/' or ','")
    return tag


def validate_tags(tags: object) -> list[str]:
    """A full tag list (create body, replace-all): a list of valid tags, at most 50."""
    if not isinstance(tags, list):
        raise bad_request("tags must be a list of strings")
    if len(tags) > MAX_TAGS:
        raise bad_request(f"a server has at most {MAX_TAGS} tags, got {len(tags)}")
    out: list[str] = []
    for tag in tags:
        if validate_tag(tag) not in out:
            out.append(tag)
    return out


def replace_all_body(body: object) -> list[str]:
    """The body of `PUT …/tags`: exactly `{"tags": [...]}`."""
    if not isinstance(body, dict) or set(body) != {"tags"}:
        raise bad_request('the body must be exactly {"tags": [...]}')
    return validate_tags(body["tags"])


def parse_filters(query: Mapping[str, str]) -> dict[str, list[str]]:
    """The tag filters present in a list query, each a de-duplicated list of tags."""
    found: dict[str, list[str]] = {}
    for name in FILTERS:
        if name not in query:
            continue
        tags: list[str] = []
        for tag in query[name].split(","):
            if validate_tag(tag) not in tags:
                tags.append(tag)
        found[name] = tags
    return found


def filter_clauses(filters: Mapping[str, list[str]]) -> list[Clause]:
    """SQL conditions over objects `o` for the given filters (ANDed together)."""
    clauses: list[Clause] = []
    for name, tags in filters.items():
        marks = ",".join("?" * len(tags))
        any_of = f"EXISTS (SELECT 1 FROM tags t WHERE t.key = o.key AND t.tag IN ({marks}))"
        if name == "tags":
            # has every tag: as many matching rows as distinct tags asked for
            clauses.append(
                (
                    f"(SELECT count(*) FROM tags t WHERE t.key = o.key AND t.tag IN ({marks})) = ?",
                    [*tags, len(tags)],
                )
            )
        elif name == "tags-any":
            clauses.append((any_of, tags))
        elif name == "not-tags":
            clauses.append((f"NOT {any_of}", tags))
        else:  # not-tags-any: lacks at least one
            clauses.append(
                (
                    f"(SELECT count(*) FROM tags t WHERE t.key = o.key AND t.tag IN ({marks})) < ?",
                    [*tags, len(tags)],
                )
            )
    return clauses


def matches(tags: set[str], filters: Mapping[str, list[str]]) -> bool:
    """The same semantics in Python, for watch events."""
    for name, wanted in filters.items():
        hits = len(tags.intersection(wanted))
        ok = {
            "tags": hits == len(wanted),
            "tags-any": hits > 0,
            "not-tags": hits == 0,
            "not-tags-any": hits < len(wanted),
        }[name]
        if not ok:
            return False
    return True


def tags_body(tags: list[str]) -> dict[str, Any]:
    return {"tags": tags}


async def handle(
    request: web.Request, store: Store, key: str, name: str, extra: tuple[str, ...]
) -> web.Response:
    """`…/servers/{name}/tags[/{tag}]`."""
    server = store.get(key)
    if server is None:
        raise not_found("servers", name)
    current: list[str] = list(server.get("tags") or [])
    method = request.method
    if len(extra) > 1:
        raise not_found("servers/tags", "/".join(extra))
    if not extra:
        if method in ("GET", "HEAD"):
            return json_response(tags_body(current))
        if method == "PUT":
            new = replace_all_body(await read_json(request))
            _save(store, key, server, new)
            return json_response(tags_body(new))
        if method == "DELETE":
            _save(store, key, server, [])
            return web.Response(status=204)
        raise StatusError(405, f"{method} is not allowed on servers/tags")
    tag = validate_tag(extra[0])
    if method in ("GET", "HEAD"):
        if tag in current:
            return web.Response(status=204)
        raise not_found("tags", tag)
    if method == "PUT":
        if tag in current:
            return web.Response(status=204)
        if len(current) >= MAX_TAGS:
            raise bad_request(f"server {name!r} already has {MAX_TAGS} tags")
        _save(store, key, server, [*current, tag])
        return web.Response(status=201, headers={"Location": str(request.rel_url.path)})
    if method == "DELETE":
        if tag not in current:
            raise not_found("tags", tag)
        _save(store, key, server, [t for t in current if t != tag])
        return web.Response(status=204)
    raise StatusError(405, f"{method} is not allowed on a tag")


def _save(store: Store, key: str, server: dict[str, Any], tags: list[str]) -> None:
    server["tags"] = tags
    store.write(key, server, create=False, tags=tags)
