"""The reference backing store: a small aiohttp + SQLite service shaped like the
multi-tenant API pods the sidecar fronts (DESIGN §10). See docs/backing-store.md."""
