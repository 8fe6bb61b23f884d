"""The real `kubectl`: where it is, or a skip where it is absent (a failure under
`CI=true`, where it must be installed). Tests take the `kubectl_binary` fixture of
tests/conftest.py; code that decides late whether it needs kubectl calls
`kubectl_binary()` here."""

from __future__ import annotations

import os
import shutil

import pytest


def kubectl_binary() -> str:
    found = shutil.which("kubectl")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is not installed (CI=true: this is a failure)")
        pytest.skip("kubectl is not installed")
    return found
