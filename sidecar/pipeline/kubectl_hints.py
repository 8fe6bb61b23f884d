"""What a kubectl user can do about a 415 (issue 29: "every 415 hint says what a kubectl
user can do").

kubectl's typed commands (`create token`, `create <generator>`, `drain`) send protobuf
and have no flag to send JSON instead, so "send JSON" alone helps nobody holding kubectl.
The errors stage passes every 415 the sidecar answers through `with_kubectl_hint`, which
adds the kubectl command that sends the same request as JSON for this request's method
and path: `kubectl create --raw PATH -f object.json` (POST), `kubectl replace --raw PATH
-f object.json` (PUT), `kubectl delete --raw PATH` (DELETE), `kubectl patch --type merge`
(PATCH).
"""

from __future__ import annotations

from sidecar.core.status import StatusError

__all__ = ["kubectl_hint", "with_kubectl_hint"]

_MARK = "With kubectl:"
# Subresources kubectl POSTs to from commands that have no `--dry-run` to print the
# object (`create token`, `drain`): the request object to write by hand.
_SUBRESOURCE_OBJECTS = {
    "token": '{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}',
    "eviction": '{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "NAME"}}',
}


def kubectl_hint(method: str, path: str) -> str:
    """The kubectl command that sends this request with a JSON body, or ""."""
    shown = path if len(path) <= 200 else path[:200] + "…"
    if method == "POST":
        known = _SUBRESOURCE_OBJECTS.get(path.rstrip("/").rsplit("/", 1)[-1])
        if known is not None:
            return (
                f"{_MARK} write the request object as JSON to a file (e.g. `echo "
                f"'{known}' > object.json`) and run `kubectl create --raw {shown} "
                f"-f object.json`."
            )
        return (
            f"{_MARK} write the object as JSON to a file (e.g. `kubectl create … "
            f"--dry-run=client -o json > object.json`) and run `kubectl create --raw "
            f"{shown} -f object.json`."
        )
    if method == "PUT":
        return (
            f"{_MARK} write the object as JSON and run "
            f"`kubectl replace --raw {shown} -f object.json`."
        )
    if method == "DELETE":
        return f"{_MARK} `kubectl delete --raw {shown}` deletes without an options body."
    if method == "PATCH":
        return f"{_MARK} send a merge patch: `kubectl patch … --type merge -p '{{…}}'`."
    return ""


def with_kubectl_hint(exc: StatusError, method: str, path: str) -> StatusError:
    """`exc` with the kubectl hint added when it is a 415 without one."""
    if exc.code != 415 or _MARK in exc.message:
        return exc
    hint = kubectl_hint(method, path)
    if not hint:
        return exc
    return StatusError(
        exc.code,
        f"{exc.message.rstrip()} {hint}",
        exc.reason,
        details=exc.details,
        headers=exc.headers,
    )
