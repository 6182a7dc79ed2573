"""Control-plane state (jobs, attempts, events, bundles index, tenants, tokens) in SQLite."""

from air_sdk.store.quota import JobQuotas
from air_sdk.store.sqlite import DEFAULT_TENANT, IdempotencyConflict, SqliteStore, hash_token

__all__ = ["DEFAULT_TENANT", "IdempotencyConflict", "JobQuotas", "SqliteStore", "hash_token"]
