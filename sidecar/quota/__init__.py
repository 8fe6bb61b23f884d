"""Quotas: policy kinds, the reservation ledger (SQLite / Redis), API and reconcile."""
