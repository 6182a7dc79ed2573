"""Tenants and API tokens: who may call the gateway, and as whom.

Tokens are stored as sha256 digests only; the plaintext is handed out once, when
the token is issued. A revoked token fails its next request.

Example:
    >>> from air_sdk.store.database import Database
    >>> auth = AuthStore(Database(":memory:"))
    >>> auth.create_tenant("acme").id
    'acme'
    >>> info, token = auth.issue_token("acme", "viewer", "dashboard")
    >>> auth.lookup_token(token)
    ('acme', 'viewer')
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import time
import uuid
from typing import Any

from air_sdk.schema import TenantInfo, TokenInfo
from air_sdk.schema.admin import ROLES
from air_sdk.store.database import Database
from air_sdk.store.migrations import DEFAULT_TENANT

__all__ = ["DEFAULT_TENANT", "AuthStore", "hash_token", "new_token"]


def hash_token(token: str) -> str:
    """Tokens are stored as sha256 digests; they carry 256 random bits, so no salt is needed."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str = "air") -> str:
    """A new random token: `prefix`, an underscore and 256 random bits.

    Example:
        >>> new_token("airw").startswith("airw_")
        True
    """
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class AuthStore:
    """Tenants, and the tokens of their users (hashed)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # ---- tokens -------------------------------------------------------------------------

    def create_token(
        self, tenant: str = DEFAULT_TENANT, role: str = "admin", name: str = ""
    ) -> str:
        """Create an API token; the plaintext is returned once and stored only hashed."""
        return self.issue_token(tenant, role, name)[1]

    def issue_token(self, tenant: str, role: str, name: str = "") -> tuple[TokenInfo, str]:
        """A new token of `role` in `tenant`: (its record, the plaintext, shown once).
        Raises KeyError for an unknown tenant, ValueError for an unknown role."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        token = new_token()
        info = TokenInfo(
            id=uuid.uuid4().hex, tenant=tenant, role=role, name=name, created_at=time.time()
        )
        with self._db.tx() as c:
            if c.execute("SELECT 1 FROM tenants WHERE id = ?", (tenant,)).fetchone() is None:
                raise KeyError(tenant)
            c.execute(
                "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?, NULL)",
                (info.id, tenant, role, name, hash_token(token), info.created_at),
            )
        return info, token

    def lookup_token(self, token: str) -> tuple[str, str] | None:
        """(tenant, role) for a live token, else None.

        The row is found by the sha256 of the token. Timing of that lookup can only
        tell an attacker about digests of guesses they made, not about a stored token
        (finding a token from a digest prefix is a preimage search over 256 bits); the
        final comparison is constant-time anyway."""
        digest = hash_token(token)
        rows = self._db.read(
            "SELECT tenant, role, token_hash FROM tokens WHERE token_hash = ?"
            " AND revoked_at IS NULL",
            (digest,),
        )
        if not rows or not hmac.compare_digest(rows[0]["token_hash"], digest):
            return None
        return rows[0]["tenant"], rows[0]["role"]

    def token_exists(self, token: str) -> bool:
        """True for a live user token or any worker token (of any attempt): two indexed
        lookups, for the rate limiter to tell a real token from a guessed one.

        Example:
            >>> auth = AuthStore(Database(":memory:"))
            >>> auth.token_exists(auth.create_token()), auth.token_exists("air_guess")
            (True, False)
        """
        digest = hash_token(token)
        rows = self._db.read(
            "SELECT 1 FROM tokens WHERE token_hash = ? AND revoked_at IS NULL"
            " UNION ALL SELECT 1 FROM attempts WHERE token_hash = ? LIMIT 1",
            (digest, digest),
        )
        return bool(rows)

    def list_tokens(
        self, tenant: str | None = None, *, include_revoked: bool = False
    ) -> list[TokenInfo]:
        """Tokens (never their plaintext), oldest first; of one tenant or of all."""
        sql, args = "SELECT * FROM tokens WHERE 1=1", list[Any]()
        if tenant is not None:
            sql += " AND tenant = ?"
            args.append(tenant)
        if not include_revoked:
            sql += " AND revoked_at IS NULL"
        rows = self._db.read(sql + " ORDER BY created_at, id", tuple(args))
        return [_token_from_row(r) for r in rows]

    def revoke_token(self, token_id: str, tenant: str | None = None) -> TokenInfo | None:
        """Revoke a token at once (its next request is a 401); with `tenant`, only one of
        that tenant. None when there is no such token. Revoking twice is a no-op."""
        with self._db.tx() as c:
            row = c.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
            if row is None or (tenant is not None and row["tenant"] != tenant):
                return None
            if row["revoked_at"] is None:
                c.execute("UPDATE tokens SET revoked_at = ? WHERE id = ?", (time.time(), token_id))
                row = c.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return _token_from_row(row)

    # ---- tenants ------------------------------------------------------------------------

    def create_tenant(self, tenant: str) -> TenantInfo | None:
        """A new tenant; None if it exists already."""
        now = time.time()
        with self._db.tx() as c:
            cur = c.execute("INSERT OR IGNORE INTO tenants VALUES (?, ?, ?)", (tenant, tenant, now))
            if cur.rowcount == 0:
                return None
        return TenantInfo(id=tenant, created_at=now)

    def get_tenant(self, tenant: str) -> TenantInfo | None:
        rows = self._db.read("SELECT id, created_at FROM tenants WHERE id = ?", (tenant,))
        return TenantInfo(id=rows[0]["id"], created_at=rows[0]["created_at"]) if rows else None

    def list_tenants(self) -> list[TenantInfo]:
        rows = self._db.read("SELECT id, created_at FROM tenants ORDER BY created_at, id")
        return [TenantInfo(id=r["id"], created_at=r["created_at"]) for r in rows]


def _token_from_row(r: sqlite3.Row) -> TokenInfo:
    return TokenInfo(
        id=r["id"],
        tenant=r["tenant"],
        role=r["role"],
        name=r["name"],
        created_at=r["created_at"],
        revoked_at=r["revoked_at"],
    )
