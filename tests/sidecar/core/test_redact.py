"""Redaction of credentials (sidecar/core/redact.py): in free text (a parser's complaint, an
exception message) and in an upstream's error answer that quotes the request's own
credential."""

from __future__ import annotations

import base64
import secrets

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.redact import MASK, mask_credential, redact_text

TOKEN = base64.urlsafe_b64encode(secrets.token_bytes(9000)).decode().rstrip("=")


def test_free_text_loses_bearer_and_basic_credentials_and_jwts() -> None:
    text = (
        "Got more than 8190 bytes when reading: b'Bearer abc.DEF-123_x~y+z/w=='. "
        "then basic dXNlcjpwYXNz and a bare eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln end; "
        "redis://user:pw@host:6379/0"
    )
    assert redact_text(text) == (
        "Got more than 8190 bytes when reading: b'Bearer ***'. "
        "then basic *** and a bare *** end; redis://user:***@host:6379/0"
    )
    plain = "GET /api/v1/pods: the token has expired (eyJ is not enough)"
    assert redact_text(plain) == plain


def test_a_quoted_start_middle_or_end_of_the_credential_is_masked() -> None:
    body = (
        f"Got more than: b'Bearer {TOKEN[:93]}...'. middle {TOKEN[5000:5400]} "
        f"end {TOKEN[-40:]}; the whole {TOKEN}!"
    ).encode()
    masked = mask_credential(body, f"Bearer {TOKEN}")
    assert (
        masked
        == (
            f"Got more than: b'Bearer {MASK}...'. middle {MASK} end {MASK}; the whole {MASK}!"
        ).encode()
    )


def test_short_credentials_and_other_text_are_left_alone() -> None:
    assert mask_credential(b"alice cannot list pods", "Bearer alice") == (b"alice cannot list pods")
    assert mask_credential(b"token dev-admin-1 refused", "Bearer dev-admin-1") == (
        b"token *** refused"
    )
    body = b'{"kind":"Status","message":"not found"}'
    assert mask_credential(body, f"Bearer {TOKEN}") == body


# A "long part" of the credential: longer than the spacing of the pieces looked for.
LONG_PART = len(TOKEN) // 32 + 32


@given(
    start=st.integers(0, len(TOKEN) - 1),
    length=st.integers(16, 1000),
    before=st.binary(max_size=50),
    after=st.binary(max_size=50),
)
def test_a_quote_of_the_start_the_end_or_a_long_part_never_survives(
    start: int, length: int, before: bytes, after: bytes
) -> None:
    quote = TOKEN[start : start + length].encode()
    masked = mask_credential(before + quote + after, f"Bearer {TOKEN}")
    at_an_end = start == 0 or start + length >= len(TOKEN)
    if len(quote) >= 16 and (at_an_end or len(quote) >= LONG_PART):
        assert quote not in masked
        assert MASK.encode() in masked
