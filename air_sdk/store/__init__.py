"""Control-plane state (jobs, attempts, events, bundles index, tenants, tokens) in SQLite."""

from air_sdk.store.auth import DEFAULT_TENANT, hash_token
from air_sdk.store.jobs import ACTIVE_STATES, IdempotencyConflict
from air_sdk.store.quota import JobQuotas
from air_sdk.store.sqlite import SqliteStore

__all__ = [
    "ACTIVE_STATES",
    "DEFAULT_TENANT",
    "IdempotencyConflict",
    "JobQuotas",
    "SqliteStore",
    "hash_token",
]
