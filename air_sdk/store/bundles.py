"""The bundles index: which code bundles (by sha256) a tenant has uploaded, and where
the gateway keeps each one. The bytes live on disk (`air_sdk.bundle`), not here.

Example:
    >>> from air_sdk.store.database import Database
    >>> bundles = BundleIndex(Database(":memory:"))
    >>> bundles.add_bundle("default", "ab" * 32, size=1024, num_files=3, path="/b/ab.tar.gz")
    >>> bundles.get_bundle("default", "ab" * 32)["num_files"], bundles.get_bundle("acme", "ab" * 32)
    (3, None)
"""

from __future__ import annotations

import sqlite3
import time

from air_sdk.store.database import Database

__all__ = ["BundleIndex"]


class BundleIndex:
    """Uploaded bundles per tenant: another tenant's bundle is not found."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add_bundle(self, tenant: str, sha256: str, size: int, num_files: int, path: str) -> None:
        """Record an upload; recording the same bundle again changes nothing."""
        with self._db.tx() as c:
            c.execute(
                "INSERT OR IGNORE INTO bundles VALUES (?, ?, ?, ?, ?, ?)",
                (tenant, sha256, size, num_files, path, time.time()),
            )

    def get_bundle(self, tenant: str, sha256: str) -> sqlite3.Row | None:
        """The bundle's row (sha256, size, num_files, path, created_at), None if
        `tenant` has not uploaded it."""
        rows = self._db.read(
            "SELECT * FROM bundles WHERE tenant = ? AND sha256 = ?", (tenant, sha256)
        )
        return rows[0] if rows else None
