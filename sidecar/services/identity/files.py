"""Reading a credential file (DESIGN §4): the static token file, the JWT public key file
and the JWKS file, and the error that says why one does not load.

A file that is empty (0 bytes, or only whitespace, as a file caught half-written is)
does not load, whatever its format would make of it: a token file rewritten empty
must never mean "no static tokens" (an explicit `[]` does), so the last good
credentials stay in force (sidecar/services/identity/credentials.py).

`CredentialFileError` carries two texts: the full message for the log and start-up
(config key, file path, problem) and `public`, the config key and the problem only,
for `/readyz`. Neither ever quotes the file's contents, which are secrets.
"""

from __future__ import annotations

from pathlib import Path

from sidecar.config.settings import ConfigError

EMPTY = "the file is empty (0 bytes or only whitespace)"


class CredentialFileError(ConfigError):
    """A credential file that does not load: `str()` names the key, the path and the
    problem; `public` the key and the problem (`public_problem` when the problem names
    something `/readyz` must not, such as a tenant)."""

    def __init__(self, key: str, path: str, problem: str, public_problem: str | None = None):
        super().__init__(f"{key}: {path}: {problem}")
        self.key = key
        self.public = f"{key}: {public_problem or problem}"


def read_credential_file(key: str, path: str, empty_hint: str = "") -> bytes:
    """The bytes of the credential file at `path`, configured as `key`; raises
    CredentialFileError when it cannot be read or is empty (`empty_hint` is added to
    that message)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CredentialFileError(key, path, f"cannot read it: {exc.strerror}") from None
    if not data.strip():
        raise CredentialFileError(key, path, EMPTY + empty_hint)
    return data
