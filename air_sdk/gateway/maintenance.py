"""Maintenance routes: `POST /v1/admin/gc` frees the files of ended jobs now.

| method | path          | who          | body      | answer   |
|--------|---------------|--------------|-----------|----------|
| POST   | /v1/admin/gc  | system admin | GcRequest | GcReport |

What goes is decided by the runner's retention (`air_sdk.runner.retention`); the
route only translates. It deletes files of every tenant, so it needs an admin of
the system tenant (the embedded gateway's token is one).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from air_sdk.gateway.app import ERROR_RESPONSES, CtxDep, GatewayContext, SystemAdminDep
from air_sdk.gateway.bodies import json_body, parse_model
from air_sdk.schema import GcReport, GcRequest

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=ERROR_RESPONSES)


@router.post("/gc", response_model=GcReport, openapi_extra=json_body(GcRequest))
async def collect_garbage(request: Request, ctx: CtxDep, _: SystemAdminDep) -> GcReport:
    """Delete (or with `dry_run` count) ended jobs' files and unused unpacked bundles."""
    # The body is read once the token is checked, and parsed off the event loop.
    raw, content_type = await request.body(), request.headers.get("content-type")
    return await run_in_threadpool(_collect_garbage, ctx, raw, content_type)


def _collect_garbage(ctx: GatewayContext, raw: bytes, content_type: str | None) -> GcReport:
    body = parse_model(GcRequest, raw, content_type)
    return ctx.runner.collect_garbage(
        dry_run=body.dry_run,
        older_than_s=body.older_than_s,
        include_checkpoints=body.include_checkpoints,
    )
