"""HTTP routes: translate a request into one store, runner or service call and the
answer back. The work is in `air_sdk.gateway.services`; an `AirError` raised there
becomes the answer's status in one place (`air_sdk.gateway.translate`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.types import Scope

import air_sdk
from air_sdk.errors import AuthError, NotFoundError
from air_sdk.gateway.app import (
    ERROR_RESPONSES,
    CtxDep,
    GatewayContext,
    Principal,
    PrincipalDep,
    bearer_token,
)
from air_sdk.gateway.bodies import json_body
from air_sdk.gateway.services.bundles import checked_sha256, store_bundle
from air_sdk.gateway.services.submit import check_idempotency_key, submit_job
from air_sdk.gateway.streams import StreamSlot, job_event_stream
from air_sdk.gateway.tenancy import cluster_view
from air_sdk.redact import redact_env
from air_sdk.runner.accounting import Accounting, AttemptTimes, account
from air_sdk.schema import (
    AttemptList,
    BundleInfo,
    CheckpointList,
    EventPage,
    EventType,
    Health,
    Inventory,
    JobList,
    JobRecord,
    JobSpec,
    JobState,
    LogPage,
    MetricsPage,
    SloReport,
)
from air_sdk.schema.names import JOB_ID, is_valid, shown
from air_sdk.store.pages import (
    LOG_PAGE_LINES,
    METRIC_PAGE_POINTS,
    read_log_page,
    read_metrics_page,
)

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)
worker_router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)

SSE_POLL_S = 0.1


def _job_or_404(ctx: CtxDep, principal: Principal, job_id: str) -> JobRecord:
    job = ctx.store.get_job(job_id, tenant=principal.tenant) if is_valid(JOB_ID, job_id) else None
    if job is None:
        raise NotFoundError(404, f"no job {shown(job_id)}: list yours with `air jobs`")
    return job


def _owned_job(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> JobRecord:
    """The job, as a dependency: resolved (or 404) before a streaming answer starts."""
    return _job_or_404(ctx, principal, job_id)


def _accounting(ctx: CtxDep, job: JobRecord) -> Accounting:
    times = [AttemptTimes(*row) for row in ctx.store.attempt_times(job.id)]
    return account(
        ctx.store.list_attempts(job.id),
        times,
        job_ended_at=job.ended_at,
        now=time.time(),
        succeeded=job.state is JobState.SUCCEEDED,
    )


def _public(job: JobRecord) -> JobRecord:
    """The job as an answer shows it: secret env values redacted (the runner, reading the
    store, still gets them)."""
    return job.model_copy(
        update={"spec": job.spec.model_copy(update={"env": redact_env(job.spec.env)})}
    )


def _with_queue_position(ctx: CtxDep, job: JobRecord) -> JobRecord:
    """A queued job with why it waits and its place in its pool's line, as the last
    scheduling cycle saw it (before its first cycle: its place in submit order)."""
    job = _public(job)
    if job.state is not JobState.QUEUED:
        return job
    reason, position = ctx.runner.queue_info(job.id)
    if reason is None and position is None:
        position = ctx.store.queue_position(job.id)
    return job.model_copy(update={"queue_position": position, "queue_reason": reason})


@router.get("/health", response_model=Health)
def health() -> Health:
    return Health(version=air_sdk.__version__)


# ---- bundles ------------------------------------------------------------------------------


@router.head("/bundles/{sha256}")
def has_bundle(sha256: str, ctx: CtxDep, principal: PrincipalDep) -> Response:
    found = ctx.store.get_bundle(principal.tenant, checked_sha256(sha256))
    return Response(status_code=200 if found else 404)


@router.put("/bundles/{sha256}", response_model=BundleInfo, status_code=201)
async def put_bundle(
    sha256: str, request: Request, ctx: CtxDep, principal: PrincipalDep
) -> BundleInfo:
    return await store_bundle(ctx, principal.tenant, sha256, request.stream())


# ---- jobs ---------------------------------------------------------------------------------


@router.post("/jobs", response_model=JobRecord, status_code=201, openapi_extra=json_body(JobSpec))
async def submit(
    request: Request,
    response: Response,
    ctx: CtxDep,
    principal: PrincipalDep,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> JobRecord:
    """Submit a JobSpec (the body). It is read once the token is checked and parsed in a
    worker thread, so a huge or malformed body never holds the event loop."""
    check_idempotency_key(idempotency_key)
    body = await request.body()
    content_type = request.headers.get("content-type")
    return await run_in_threadpool(
        _submit, ctx, principal, body, content_type, idempotency_key, response
    )


def _submit(
    ctx: GatewayContext,
    principal: Principal,
    body: bytes,
    content_type: str | None,
    idempotency_key: str | None,
    response: Response,
) -> JobRecord:
    job, created = submit_job(ctx, principal, body, content_type, idempotency_key)
    if not created:
        response.status_code = 200
    return _with_queue_position(ctx, job)


@router.get("/jobs", response_model=JobList)
def list_jobs(
    ctx: CtxDep,
    principal: PrincipalDep,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JobList:
    jobs = ctx.store.list_jobs(
        tenant=principal.tenant, states=(state,) if state else None, limit=limit
    )
    return JobList(jobs=[_with_queue_position(ctx, j) for j in jobs])


@router.get("/jobs/{job_id}", response_model=JobRecord)
def get_job(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> JobRecord:
    job = _with_queue_position(ctx, _job_or_404(ctx, principal, job_id))
    if job.attempt:
        acc = _accounting(ctx, job)
        update = {"goodput": acc.goodput, "productive_s": sum(acc.productive_s.values())}
        job = job.model_copy(update={**update, "wall_s": acc.wall_s})
    return job


@router.post("/jobs/{job_id}/cancel", response_model=JobRecord)
def cancel_job(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> JobRecord:
    job = _job_or_404(ctx, principal, job_id)
    if job.state.terminal:
        return _public(job)  # cancelling an ended job is a no-op, not an error
    job = ctx.store.request_cancel(job_id)
    ctx.runner.wake()
    return _public(job)


@router.get("/jobs/{job_id}/attempts", response_model=AttemptList)
def list_attempts(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> AttemptList:
    job = _job_or_404(ctx, principal, job_id)
    acc = _accounting(ctx, job)
    return AttemptList(
        attempts=[
            a.model_copy(
                update={
                    "productive_s": acc.productive_s.get(a.attempt),
                    "time_lost_s": acc.lost_s.get(a.attempt),
                }
            )
            for a in ctx.store.list_attempts(job_id)
        ]
    )


@router.get("/jobs/{job_id}/events", response_model=EventPage)
async def events_page(
    job_id: str,
    ctx: CtxDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    wait: Annotated[float, Query(ge=0, le=60, description="Long-poll seconds")] = 0,
    type: Annotated[  # noqa: A002 - the query parameter's name
        list[EventType] | None, Query(description="Only events of these types")
    ] = None,
) -> EventPage:
    job = await run_in_threadpool(_job_or_404, ctx, principal, job_id)
    deadline = asyncio.get_running_loop().time() + wait
    while ctx.store.last_seq(job_id) <= after and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(SSE_POLL_S)
    types = tuple(type) if type else None
    events = await run_in_threadpool(
        ctx.store.read_events, job_id, after=after, limit=limit, types=types
    )
    job = ctx.store.get_job(job_id) or job
    return EventPage(events=events, last_seq=events[-1].seq if events else after, state=job.state)


@router.get("/jobs/{job_id}/events/stream", response_class=EventSourceResponse)
async def events_stream(
    job_id: str,
    request: Request,
    _: Annotated[JobRecord, Depends(_owned_job)],
    __: StreamSlot,  # 429 past the tenant's or token's cap (air_sdk.gateway.streams)
    after: Annotated[int, Query(ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> AsyncIterator[ServerSentEvent]:
    """Every event after `after` (or the Last-Event-ID a reconnecting client sends),
    then new ones as they happen; the stream ends once the job has ended."""
    if last_event_id and last_event_id.isdigit():
        after = max(after, int(last_event_id))
    async for message in job_event_stream(request, job_id, after):
        yield message


@router.get("/jobs/{job_id}/logs", response_model=LogPage)
def job_logs(
    job_id: str,
    ctx: CtxDep,
    principal: PrincipalDep,
    rank: Annotated[int | None, Query(ge=0)] = None,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="The newest N lines")] = None,
    after: Annotated[int, Query(ge=0, description="Lines of reports after this seq")] = 0,
    before: Annotated[
        int | None, Query(ge=1, description="With tail: lines of reports before this seq")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100_000, description="Lines per page, about")] = (
        LOG_PAGE_LINES
    ),
) -> LogPage:
    """One page of log lines (about `limit` lines, at most ~4 MiB of text): page on with
    `after=last_seq` while `more`; with `tail`, go back with `before=first_seq`."""
    _job_or_404(ctx, principal, job_id)
    return read_log_page(
        ctx.store,
        job_id,
        after=after,
        before=before,
        rank=rank,
        attempt=attempt,
        tail=tail,
        max_lines=limit,
    )


@router.get("/jobs/{job_id}/metrics", response_model=MetricsPage)
def job_metrics(
    job_id: str,
    ctx: CtxDep,
    principal: PrincipalDep,
    name: str | None = None,
    rank: Annotated[int | None, Query(ge=0)] = None,
    after: Annotated[int, Query(ge=0, description="Points of reports after this seq")] = 0,
    limit: Annotated[int, Query(ge=1, le=200_000, description="Points per page, about")] = (
        METRIC_PAGE_POINTS
    ),
) -> MetricsPage:
    """One page of metric points: page on with `after=last_seq` while `more`."""
    _job_or_404(ctx, principal, job_id)
    return read_metrics_page(ctx.store, job_id, after=after, name=name, rank=rank, max_points=limit)


@router.get("/jobs/{job_id}/checkpoints", response_model=CheckpointList)
def job_checkpoints(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> CheckpointList:
    _job_or_404(ctx, principal, job_id)
    events = ctx.store.read_events(job_id, types=(EventType.CHECKPOINT,), limit=100_000)
    return CheckpointList.from_events(events)


@router.get("/slo", response_model=SloReport)
def slo(ctx: CtxDep, principal: PrincipalDep) -> SloReport:
    """The SLOs of the caller's tenant (a system admin's: every tenant's), measured now."""
    tenant = None if principal.is_system_admin else principal.tenant
    return SloReport(slos=ctx.runner.slo_watch.statuses(tenant, time.time()))


@router.get("/cluster", response_model=Inventory)
def cluster(ctx: CtxDep, principal: PrincipalDep) -> Inventory:
    return cluster_view(ctx, principal)


# ---- workers ------------------------------------------------------------------------------


@worker_router.post("/jobs/{job_id}/attempts/{attempt}/report", status_code=204)
async def worker_report(job_id: str, attempt: int, request: Request) -> Response:
    """Batched metrics, log lines, heartbeats and exits from one rank, authenticated by
    the attempt's worker token; posts of an older attempt are fenced off (409). The body
    is JSON or msgpack, as its Content-Type says (415 for anything else). Served in
    front of the middleware stack (`air_sdk.gateway.report_shortcut`), here only when
    that is off (CORS configured)."""
    body = await request.body()
    content_type = request.headers.get("content-type")
    await ingest_worker_report(
        request.scope, job_id, attempt, bearer_token(request), body, content_type
    )
    return Response(status_code=204)


async def ingest_worker_report(
    scope: Scope,
    job_id: str,
    attempt: int,
    token: str | None,
    body: bytes,
    content_type: str | None,
) -> None:
    """The report route's own work, for the route and for `ReportShortcut`: a 401 without
    a worker token, then the report ingested by the gateway's `ReportWriter` (answered
    once committed)."""
    if token is None or not is_valid(JOB_ID, job_id):
        raise AuthError(401, "a worker report needs the attempt's AIR_JOB_TOKEN")
    ctx: GatewayContext = scope["app"].state.air
    assert ctx.reports is not None, "create_app makes the report writer"
    await ctx.reports.ingest(job_id, attempt, token, body, content_type)
