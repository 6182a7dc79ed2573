"""Admin routes (`/v1/admin/...`): tenants, tokens and node health.

Every route needs an admin token. A tenant's admin manages its own tenant's
tokens; another tenant is "not found", exactly like one that does not exist. An
admin of the system tenant (`default`, created with the database) manages every
tenant and the shared nodes.

| method | path                               | who                | answer        |
|--------|------------------------------------|--------------------|---------------|
| GET    | /v1/admin/tenants                  | admin (own / all)  | TenantList    |
| POST   | /v1/admin/tenants                  | system admin       | TenantInfo    |
| GET    | /v1/admin/tokens?tenant=           | admin (own / all)  | TokenList     |
| POST   | /v1/admin/tokens                   | admin (own / all)  | TokenCreated  |
|        |   (role `metrics`: system admin, tenant `default` only)  |               |
| POST   | /v1/admin/tokens/{token_id}/revoke | admin (own / all)  | TokenInfo     |
| GET    | /v1/admin/nodes                    | system admin       | NodeHealthList|
| POST   | /v1/admin/nodes/{name}/clear       | system admin       | NodeHealth    |
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool

from air_sdk.gateway.app import (
    ERROR_RESPONSES,
    AdminDep,
    CtxDep,
    GatewayContext,
    Principal,
    SystemAdminDep,
)
from air_sdk.gateway.bodies import json_body, parse_model
from air_sdk.schema import (
    NodeHealth,
    NodeHealthList,
    TenantCreate,
    TenantInfo,
    TenantList,
    TokenCreate,
    TokenCreated,
    TokenInfo,
    TokenList,
)
from air_sdk.schema.names import NODE, TOKEN_ID, is_valid, shown
from air_sdk.store import DEFAULT_TENANT

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=ERROR_RESPONSES)


def _tenant_or_404(ctx: GatewayContext, principal: Principal, tenant: str) -> str:
    # Another tenant is "not found" for a tenant's admin: its existence is not theirs to learn.
    if (not principal.is_system_admin and tenant != principal.tenant) or (
        ctx.store.get_tenant(tenant) is None
    ):
        raise HTTPException(
            404, f"no tenant {shown(tenant)}: list yours with `air admin tenant list`"
        )
    return tenant


@router.get("/tenants", response_model=TenantList)
def list_tenants(ctx: CtxDep, principal: AdminDep) -> TenantList:
    tenants = ctx.store.list_tenants()
    if not principal.is_system_admin:
        tenants = [t for t in tenants if t.id == principal.tenant]
    crashes = [ctx.runner.tenant_crashes(t.id) for t in tenants]
    return TenantList(
        tenants=[
            t.model_copy(
                update={"crashes_last_hour": c.num_crashes, "max_restarts_per_hour": c.cap}
            )
            for t, c in zip(tenants, crashes, strict=True)
        ]
    )


@router.post(
    "/tenants", response_model=TenantInfo, status_code=201, openapi_extra=json_body(TenantCreate)
)
async def create_tenant(request: Request, ctx: CtxDep, _: SystemAdminDep) -> TenantInfo:
    # The body is read once the token is checked, and parsed off the event loop.
    raw, content_type = await request.body(), request.headers.get("content-type")
    return await run_in_threadpool(_create_tenant, ctx, raw, content_type)


def _create_tenant(ctx: GatewayContext, raw: bytes, content_type: str | None) -> TenantInfo:
    body = parse_model(TenantCreate, raw, content_type)
    if ctx.tenant_refusal is not None:
        raise HTTPException(409, f"this gateway serves one tenant: {ctx.tenant_refusal}")
    info = ctx.store.create_tenant(body.name)
    if info is None:
        raise HTTPException(409, f"tenant {body.name!r} exists already")
    return info


@router.get("/tokens", response_model=TokenList)
def list_tokens(
    ctx: CtxDep,
    principal: AdminDep,
    tenant: Annotated[str | None, Query(max_length=63)] = None,
    include_revoked: bool = False,
) -> TokenList:
    if tenant is not None:
        scope: str | None = _tenant_or_404(ctx, principal, tenant)
    else:
        scope = None if principal.is_system_admin else principal.tenant
    return TokenList(tokens=ctx.store.list_tokens(scope, include_revoked=include_revoked))


@router.post(
    "/tokens", response_model=TokenCreated, status_code=201, openapi_extra=json_body(TokenCreate)
)
async def create_token(request: Request, ctx: CtxDep, principal: AdminDep) -> TokenCreated:
    """Issue a token; the answer is the only place its plaintext ever appears."""
    raw, content_type = await request.body(), request.headers.get("content-type")
    return await run_in_threadpool(_create_token, ctx, principal, raw, content_type)


def _create_token(
    ctx: GatewayContext, principal: Principal, raw: bytes, content_type: str | None
) -> TokenCreated:
    body = parse_model(TokenCreate, raw, content_type)
    tenant = _tenant_or_404(ctx, principal, body.tenant or principal.tenant)
    if body.role == "metrics" and not (principal.is_system_admin and tenant == DEFAULT_TENANT):
        # /metrics names every tenant: only the system admin hands out a way to read it
        raise HTTPException(
            403,
            f"a metrics token is issued by a system admin, in tenant {DEFAULT_TENANT!r}"
            " (/metrics shows every tenant)",
        )
    info, token = ctx.store.issue_token(tenant, body.role, body.name)
    return TokenCreated(info=info, token=token)


@router.post("/tokens/{token_id}/revoke", response_model=TokenInfo)
def revoke_token(token_id: str, ctx: CtxDep, principal: AdminDep) -> TokenInfo:
    """Revoke a token at once: its next request is a 401. Revoking twice is a no-op."""
    info = None
    if is_valid(TOKEN_ID, token_id):
        scope = None if principal.is_system_admin else principal.tenant
        info = ctx.store.revoke_token(token_id, tenant=scope)
    if info is None:
        raise HTTPException(
            404, f"no token {shown(token_id)}: list them with `air admin token list`"
        )
    return info


def node_health(ctx: GatewayContext) -> dict[str, NodeHealth]:
    """Every node's failure record and health (also what /metrics shows)."""
    failures = ctx.store.node_failures()
    unhealthy = ctx.runner.unhealthy_nodes()
    probes = ctx.runner.prober.results() if ctx.runner.prober is not None else {}
    names = [n.name for n in ctx.runner.backend.inventory()]
    names += sorted(set(failures) - set(names))
    return {
        name: NodeHealth(
            name=name,
            num_failures=failures.get(name, (0, 0.0))[0],
            last_failure_at=failures[name][1] if name in failures else None,
            healthy=name not in unhealthy,
            probe=probes.get(name),
        )
        for name in names
    }


@router.get("/nodes", response_model=NodeHealthList)
def list_nodes(ctx: CtxDep, _: SystemAdminDep) -> NodeHealthList:
    return NodeHealthList(nodes=list(node_health(ctx).values()))


@router.post("/nodes/{name}/clear", response_model=NodeHealth)
def clear_node(name: str, ctx: CtxDep, _: SystemAdminDep) -> NodeHealth:
    """Forget a node's failures, so the scheduler places jobs on it again at once."""
    known = node_health(ctx) if is_valid(NODE, name) else {}
    if name not in known:
        raise HTTPException(404, f"no node {shown(name)}: list them with `air admin node list`")
    ctx.runner.clear_node(name)
    return node_health(ctx)[name]
