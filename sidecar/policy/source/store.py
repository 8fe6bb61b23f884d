"""The policy in force: loaded at start, replaced atomically on reload.

Requests read `store.current` once at their start (one attribute read, so a swap is
atomic for them). Start-up with a broken policy fails; later broken changes are
refused and the last good bundle stays in force.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sidecar.policy.source.bundle import PolicyBundle, load_bundle
from sidecar.policy.source.files import Problem

log = logging.getLogger("sidecar.policy")


class PolicyLoadError(Exception):
    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class PolicyStore:
    def __init__(self, paths: Sequence[str | Path]) -> None:
        self.paths = [Path(p) for p in paths]
        bundle, problems = load_bundle(self.paths)
        if problems:
            raise PolicyLoadError(problems)
        self.current: PolicyBundle = bundle
        # The files' bundle alone; `current` is it joined with the API policy objects
        # (`layer`, set by the API policy follower: DESIGN §5, `source/api.py`).
        self.files: PolicyBundle = bundle
        self.layer: Callable[[PolicyBundle], PolicyBundle] | None = None
        # Called with a loaded files' bundle off the event loop (the reload thread), so
        # that joining it in `apply` costs the event loop little.
        self.prepare: Callable[[PolicyBundle], None] | None = None
        self.last_error: list[Problem] = []
        # When the bundle in force was loaded, and the last refused change (if any).
        self.loaded_at = time.time()
        self.refused_at: float | None = None

    def load(self) -> tuple[PolicyBundle, list[Problem]]:
        """Load, validate and compile the policy paths without touching `current`.
        Pure and thread-safe: the reloader runs it off the event loop."""
        bundle, problems = load_bundle(self.paths)
        if not problems and not bundle.documents:
            where = str(self.paths[0]) if self.paths else "policies"
            problems = [Problem(where, 0, "the policy has no documents; refusing an empty policy")]
        if not problems and self.prepare is not None:
            self.prepare(bundle)
        return bundle, problems

    def apply(self, bundle: PolicyBundle, problems: Sequence[Problem]) -> bool:
        """Put a loaded bundle in force if it has no problems (one attribute write, so
        atomic for requests); otherwise keep the last good one and remember why."""
        if problems:
            self.last_error = list(problems)
            self.refused_at = time.time()
            for p in problems:
                log.error("policy reload refused: %s", p)
            return False
        self.last_error = []
        self.refused_at = None
        self.files = bundle
        self.current = self.layer(bundle) if self.layer is not None else bundle
        self.loaded_at = time.time()
        return True

    def reload(self) -> bool:
        """Load, validate and compile; swap only if clean. Returns whether it swapped."""
        bundle, problems = self.load()
        return self.apply(bundle, problems)
