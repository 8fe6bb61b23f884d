"""The result of an authorization decision, as the rest of the sidecar sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Outcome = Literal["allow", "deny", "filter", "notfound"]


@dataclass(frozen=True, slots=True)
class Decision:
    """`filter`: allowed only through an owner rule; lists are owner-filtered and
    creates must carry the caller's tenant as owner. `notfound`: answer 404."""

    outcome: Outcome
    reason: str
    revision: str
    owner_field: str = "spec.owner"
    # Stable id of the rule that allowed it (for test coverage); "" when none did.
    rule_id: str = ""

    @property
    def allowed(self) -> bool:
        return self.outcome in ("allow", "filter")
