"""An authenticated caller (`Identity`) and the rule for user and group names.

Pure (standard library only): the decision, the authenticators and the stages all
speak of callers through this one type.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from sidecar.core.target import SYSTEM_TENANT


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. `alice@acme` and `alice@beta` are different subjects.

    An identity taken on by impersonation (`Impersonate-User`, DESIGN §4) names the
    caller who sent the request in `impersonated_by`; every stage after the
    impersonation stage decides, charges and forwards as this identity, and
    `authenticator` stays the caller's (the credential the request carries)."""

    user: str
    tenant: str
    groups: tuple[str, ...] = ()
    authenticator: str = ""
    impersonated_by: Identity | None = None

    @property
    def is_operator(self) -> bool:
        """Users of the `system` tenant are platform operators."""
        return self.tenant == SYSTEM_TENANT

    @property
    def sender(self) -> Identity:
        """Who sent the request: the caller who impersonates, else this identity."""
        return self.impersonated_by or self


MAX_NAME = 256
# Control characters (C0 and C1, e.g. U+0085), line and paragraph separators
# (U+2028, U+2029) and lone surrogates: a name holding one could break a log line.
_NOT_IN_NAMES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def printable(value: str) -> bool:
    """The rule for user and group names (of every authenticator and of impersonation):
    they become header values and log fields, so bounded, and no character that any
    reader could take for a line break or a control."""
    return 0 < len(value) <= MAX_NAME and not any(
        unicodedata.category(c) in _NOT_IN_NAMES for c in value
    )
