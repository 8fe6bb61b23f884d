"""Policy-as-code authorization sidecar for multi-tenant APIs."""

__version__ = "0.1.0"
