"""The "already decided" marker (DESIGN §13): a request the decider routed to the full
proxy was charged to its tenant's rate limit there, so the proxy must not charge it
again; and a client must not be able to say so itself.

The marker is `x-sidecar-decided: <expiry>.<nonce>.<hmac>`, an HMAC-SHA256 under a key
only the sidecar's processes hold (made once per `sidecar serve`, before the workers
fork, so every worker's proxy accepts what any worker's decider signed) over the expiry,
a random nonce, the method, the raw request target and the `Authorization` header. A
marker saves one charge once: the proxy remembers the markers it accepted until they
expire, and charges a marker it saw before (a hostile review replayed one marker,
obtained from a decision listener a client could reach, for 20 uncharged requests in
its 30 s; a front never sends one twice). Per process: with N workers a marker saves at
most N charges. The decider sets it only
on a `proxy` allow; the front passes it to the proxy and never to the client. A marker
the proxy cannot verify (absent, forged, expired, for another request) changes nothing:
the request is charged as usual. The proxy drops it before forwarding (`x-sidecar-*`
never reaches the upstream). What it saves is one bucket charge, never a decision: the
proxy decides every request again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from collections import OrderedDict

from aiohttp import web
from multidict import CIMultiDictProxy

HEADER = "x-sidecar-decided"
_KEY = os.urandom(32)
# Markers accepted and not yet expired, remembered per process at most this many; a
# marker that finds no room is charged (never the other way round).
MAX_REMEMBERED = 200_000


class Marker:
    """Signs and verifies markers with this process tree's key."""

    def __init__(self, ttl_seconds: float = 30.0, key: bytes | None = None) -> None:
        self.ttl = max(1.0, ttl_seconds)
        self._key = key if key is not None else _KEY
        # mac -> expiry of the markers `already_charged` accepted, oldest first.
        self._used: OrderedDict[str, int] = OrderedDict()

    def _mac(self, expiry: str, nonce: str, method: str, target: str, authorization: str) -> str:
        message = "\n".join((expiry, nonce, method, target, authorization)).encode(
            "utf-8", "surrogateescape"
        )
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def sign(self, method: str, target: str, authorization: str) -> str:
        expiry = str(int(time.time() + self.ttl))
        nonce = os.urandom(8).hex()
        return f"{expiry}.{nonce}.{self._mac(expiry, nonce, method, target, authorization)}"

    def verify(self, value: str, method: str, target: str, authorization: str) -> bool:
        expiry, _, rest = value.partition(".")
        nonce, sep, mac = rest.partition(".")
        if not sep or not expiry.isdigit() or len(nonce) != 16 or len(mac) != 64:
            return False
        if int(expiry) < time.time():
            return False
        return hmac.compare_digest(mac, self._mac(expiry, nonce, method, target, authorization))

    def _first_use(self, value: str) -> bool:
        """Whether `value` (verified) is presented for the first time; remembers it."""
        used = self._used
        now = time.time()
        while used:
            oldest, expiry = next(iter(used.items()))
            if expiry >= now:
                break
            del used[oldest]
        mac = value.rpartition(".")[2]
        if mac in used or len(used) >= MAX_REMEMBERED:
            return False
        used[mac] = int(value.partition(".")[0])
        return True

    def seal(self, payload: bytes) -> str:
        """`payload` with a MAC, for a front to hand back later (nginx's refusals)."""
        mac = hmac.new(self._key, b"seal\n" + payload, hashlib.sha256).hexdigest()[:32]
        return base64.urlsafe_b64encode(payload).decode() + "." + mac

    def unseal(self, sealed: str) -> bytes | None:
        """The payload `seal` made, or None when `sealed` is not one of ours."""
        data, sep, mac = sealed.partition(".")
        if not sep or len(mac) != 32:
            return None
        try:
            payload = base64.urlsafe_b64decode(data.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            return None
        good = hmac.new(self._key, b"seal\n" + payload, hashlib.sha256).hexdigest()[:32]
        return payload if hmac.compare_digest(good, mac) else None

    def charged(self, request: web.Request) -> bool:
        """`already_charged` for a request reaching the proxy."""
        if HEADER not in request.headers:
            return False
        return self.already_charged(request.method, request.raw_path, request.headers)

    def already_charged(self, method: str, target: str, headers: CIMultiDictProxy[str]) -> bool:
        """Whether a request reaching the proxy carries one valid marker for itself."""
        values = headers.getall(HEADER, ())
        if len(values) != 1:
            return False
        if not self.verify(values[0], method, target, headers.get("Authorization", "")):
            return False
        return self._first_use(values[0])


__all__ = ["HEADER", "Marker"]
