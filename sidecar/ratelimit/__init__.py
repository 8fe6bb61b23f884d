"""Per-tenant rate limits: local token buckets and the optional global Redis tier."""
