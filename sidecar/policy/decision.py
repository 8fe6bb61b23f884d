"""The result of the one decision function (`decide.py`), as the rest of the sidecar sees it.

A `Verdict` says what the request gets (allow / filter → forwarded, deny → 403,
notfound → 404), why, which binding → role → rule allowed it, and what owner rules
still ask of it (a list filter, the owner fields a write's body must keep to the
caller's tenant, or the stored object the verdict depends on). A refusal also says
whether a mode (dry-run) may relax it (`relaxable`) or why no mode ever does (`held`):
`decide.py` computes both, and every stage, command and review that asks "would this
be forwarded?" reads them (`sidecar.policy.kinds.modes.forwards`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.core.status import StatusError
from sidecar.core.target import RequestTarget

Outcome = Literal["allow", "deny", "filter", "notfound"]
OUTCOMES: tuple[Outcome, ...] = ("allow", "deny", "filter", "notfound")
STATUS: dict[Outcome, int] = {"allow": 200, "filter": 200, "deny": 403, "notfound": 404}


@dataclass(frozen=True, slots=True)
class OwnerConstraints:
    """What owner rules ask of an allowed request.

    `list_field`: forward the list with `?owner={tenant}` and keep only the items whose
    field is the caller's tenant. `body_fields`: the owner fields a create, update or
    patch body must leave the caller's tenant (filled in when empty). `foreign_owner`:
    a grant in force cluster-wide allows the request, so any owner may be set."""

    list_field: str = ""
    body_fields: tuple[str, ...] = ()
    foreign_owner: bool = False


NO_OWNER_CONSTRAINTS = OwnerConstraints()


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    reason: str
    revision: str
    # The target as decided (a short path resolved to its tenant).
    target: RequestTarget | None = None
    # "binding → role → rule" of the grant that allowed it; "" when nothing did.
    explanation: str = ""
    # Stable id of the rule that allowed it (for test coverage); "" when none did.
    rule_id: str = ""
    owner_field: str = "spec.owner"
    owner: OwnerConstraints = NO_OWNER_CONSTRAINTS
    # Owner rules alone could grant this item: the answer depends on the stored
    # object's owner, which the caller of `decide` must read and pass in.
    needs_object: bool = False
    # The body must be checked against `owner.body_fields` (pass it to `decide`).
    needs_body: bool = False
    # The checked body to forward (the owner filled in), when a body was checked.
    body: Any = None
    # Refused by tenant isolation (the target is outside the caller's reach).
    isolated: bool = False
    # A refusal inside the caller's own tenant, which a mode (dry-run) may relax: the
    # request is then forwarded as this verdict still asks (`owner`, `body`).
    relaxable: bool = False
    # Why no mode relaxes this refusal (isolation, concealment, owner rules, ...); ""
    # when allowed or relaxable.
    held: str = ""
    # What the caller gets for a refusal (403 or 404 Status); None when allowed.
    error: StatusError | None = field(default=None, compare=False)

    @property
    def allowed(self) -> bool:
        return self.outcome in ("allow", "filter")

    @property
    def status(self) -> int:
        """The HTTP status this verdict answers (allowed: the request is forwarded)."""
        return STATUS[self.outcome]

    def refusal(self) -> StatusError:
        """The error to answer a refused request with."""
        if self.error is not None:
            return self.error
        return StatusError(self.status, self.reason)
