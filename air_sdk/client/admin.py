"""`Admin`: tenants, tokens and node health, over `/v1/admin/...` (needs an admin token).

Examples marked `+SKIP` need a running gateway and an admin token.

Example:
    >>> admin = Client().admin  # doctest: +SKIP
    >>> created = admin.create_token(tenant="acme", role="member", name="ci")  # doctest: +SKIP
    >>> created.token  # shown once; the gateway keeps only its digest  # doctest: +SKIP
    'air_...'
"""

from __future__ import annotations

from urllib.parse import quote

from air_sdk.client._http import HttpTransport, parse_model
from air_sdk.schema.admin import (
    NodeHealth,
    NodeHealthList,
    Role,
    TenantInfo,
    TenantList,
    TokenCreated,
    TokenInfo,
    TokenList,
)
from air_sdk.schema.gc import GcReport, GcRequest

__all__ = ["Admin"]


class Admin:
    """The admin API of one gateway. A tenant's admin sees and manages its own tenant;
    an admin of the system tenant `default` every tenant, and the nodes."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    def tenants(self) -> list[TenantInfo]:
        """Tenants you manage (all of them for a system admin)."""
        return parse_model(TenantList, self._http.request("GET", "/v1/admin/tenants")).tenants

    def create_tenant(self, name: str) -> TenantInfo:
        """A new tenant (system admin only); an existing name is a ConflictError."""
        response = self._http.request("POST", "/v1/admin/tenants", json={"name": name})
        return parse_model(TenantInfo, response)

    def tokens(
        self, tenant: str | None = None, *, include_revoked: bool = False
    ) -> list[TokenInfo]:
        """Tokens (never their plaintext) of `tenant`, or of every tenant you manage."""
        params = {"tenant": tenant, "include_revoked": include_revoked}
        response = self._http.request("GET", "/v1/admin/tokens", params=params)
        return parse_model(TokenList, response).tokens

    def create_token(
        self, *, tenant: str | None = None, role: Role = "member", name: str = ""
    ) -> TokenCreated:
        """Issue a token (default: in your own tenant); `.token` is its only showing."""
        body = {"tenant": tenant, "role": role, "name": name}
        return parse_model(TokenCreated, self._http.request("POST", "/v1/admin/tokens", json=body))

    def revoke_token(self, token_id: str) -> TokenInfo:
        """Revoke a token by id: its next request gets a 401."""
        path = f"/v1/admin/tokens/{quote(token_id, safe='')}/revoke"
        return parse_model(TokenInfo, self._http.request("POST", path))

    def nodes(self) -> list[NodeHealth]:
        """Every node's failure record and health (system admin only)."""
        return parse_model(NodeHealthList, self._http.request("GET", "/v1/admin/nodes")).nodes

    def clear_node(self, name: str) -> NodeHealth:
        """Forget a node's failures: the scheduler uses it again at once."""
        path = f"/v1/admin/nodes/{quote(name, safe='')}/clear"
        return parse_model(NodeHealth, self._http.request("POST", path))

    def collect_garbage(
        self,
        *,
        dry_run: bool = False,
        older_than_s: float | None = None,
        include_checkpoints: bool = False,
    ) -> GcReport:
        """Delete the files of ended jobs (those the gateway's retention selects, or that
        ended more than `older_than_s` ago) and unpacked bundles no job uses; with
        `dry_run`, only say what would go (system admin only). Checkpoints under a job's
        directory stay unless `include_checkpoints`.

        Example:
            >>> Client().admin.collect_garbage(dry_run=True).bytes_freed  # doctest: +SKIP
            419430400
        """
        body = GcRequest(
            dry_run=dry_run, older_than_s=older_than_s, include_checkpoints=include_checkpoints
        ).model_dump()
        return parse_model(GcReport, self._http.request("POST", "/v1/admin/gc", json=body))
