"""`GET /metrics`: the gateway's metrics for Prometheus (`air_sdk.gateway.metrics`).

Who may scrape (docs/operations.md):

- a `metrics` token (only the system admin issues one; it reads this and nothing
  else) or a system admin's token;
- without a token, a peer at a loopback address, when the gateway allows it
  (`--metrics-from-loopback`: `auto` allows it only for a gateway bound to a loopback
  address without trusted proxies, e.g. the embedded one). A gateway bound to
  0.0.0.0 refuses it by default: a reverse proxy on the same host would make every
  remote client's request come from 127.0.0.1.

Every other caller gets 403 (a token of another role) or 401 (none): the metrics name
every tenant and node.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from air_sdk.gateway.app import ERROR_RESPONSES, CtxDep, GatewayContext, Principal, bearer_token
from air_sdk.gateway.options import is_loopback
from air_sdk.store import DEFAULT_TENANT

__all__ = ["router"]

router = APIRouter(responses=ERROR_RESPONSES)


def _may_scrape(request: Request, ctx: GatewayContext) -> None:
    token = bearer_token(request)
    if token is None:
        peer = request.client.host if request.client else ""
        if ctx.metrics_from_loopback and is_loopback(peer):
            return
        raise HTTPException(
            401,
            "/metrics needs a metrics token: a system admin issues one with"
            " `air admin token create --role metrics`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    found = ctx.store.lookup_token(token)
    if found is None:
        raise HTTPException(
            401,
            "the token is not valid (revoked, or for another gateway)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = Principal(*found)
    scraper = principal.role == "metrics" and principal.tenant == DEFAULT_TENANT
    if not (scraper or principal.is_system_admin):
        raise HTTPException(
            403,
            f"/metrics shows every tenant: it needs a metrics token or a system admin's;"
            f" yours is a {principal.role} token of tenant {principal.tenant!r}",
        )


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, ctx: CtxDep) -> Response:
    """The registry in Prometheus' text format, gauges read now."""
    _may_scrape(request, ctx)
    assert ctx.metrics is not None  # create_app attaches them
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
