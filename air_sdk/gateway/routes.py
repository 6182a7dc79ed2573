"""HTTP routes: translate a request into one store/runner call and the answer back."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import ValidationError

import air_sdk
from air_sdk.bundle import DEFAULT_MAX_BYTES, unpack_bundle
from air_sdk.errors import BundleError, BundleTooLargeError
from air_sdk.gateway.app import (
    ERROR_RESPONSES,
    CtxDep,
    GatewayContext,
    Principal,
    PrincipalDep,
    bearer_token,
    get_ctx,
)
from air_sdk.gateway.bodies import describe_validation_error, json_body, parse_model
from air_sdk.planner.refusal import submit_refusal
from air_sdk.redact import Redactor, redact_env
from air_sdk.runner.accounting import Accounting, AttemptTimes, account
from air_sdk.runner.service import spec_request
from air_sdk.scheduler import fits_ever
from air_sdk.schema import (
    AttemptList,
    BundleInfo,
    CheckpointList,
    EventPage,
    EventType,
    FunctionResult,
    GpuInfo,
    Health,
    Inventory,
    JobList,
    JobRecord,
    JobSpec,
    JobState,
    LogPage,
    MetricsPage,
    NodeInfo,
    WorkerReport,
)
from air_sdk.schema.events import CheckpointRestore
from air_sdk.schema.names import IDEMPOTENCY_KEY, JOB_ID, SHA256, is_valid, shown
from air_sdk.store import IdempotencyConflict
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
        raise HTTPException(404, f"no job {shown(job_id)}: list yours with `air jobs`")
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


def _sha_or_400(sha256: str) -> str:
    if not is_valid(SHA256, sha256):
        raise HTTPException(400, "a bundle id is the sha256 of its bytes: 64 lowercase hex digits")
    return sha256


@router.get("/health", response_model=Health)
def health() -> Health:
    return Health(version=air_sdk.__version__)


# ---- bundles ------------------------------------------------------------------------------


@router.head("/bundles/{sha256}")
def has_bundle(sha256: str, ctx: CtxDep, principal: PrincipalDep) -> Response:
    found = ctx.store.get_bundle(principal.tenant, _sha_or_400(sha256))
    return Response(status_code=200 if found else 404)


@router.put("/bundles/{sha256}", response_model=BundleInfo, status_code=201)
async def put_bundle(
    sha256: str, request: Request, ctx: CtxDep, principal: PrincipalDep
) -> BundleInfo:
    _sha_or_400(sha256)
    existing = ctx.store.get_bundle(principal.tenant, sha256)
    if existing is not None:
        return BundleInfo(sha256=sha256, size=existing["size"], num_files=existing["num_files"])
    ctx.bundles_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=ctx.bundles_dir, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > DEFAULT_MAX_BYTES:
                    raise HTTPException(
                        413,
                        f"the bundle is over {DEFAULT_MAX_BYTES >> 20} MiB: add large files"
                        " to .airignore and read them from shared storage",
                    )
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != sha256:
            raise HTTPException(400, "the uploaded bytes do not hash to the sha256 in the URL")
        num_files = await run_in_threadpool(_check_bundle, tmp)
        final = ctx.bundles_dir / f"{sha256}.tar.gz"
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    ctx.store.add_bundle(principal.tenant, sha256, size, num_files, str(final))
    return BundleInfo(sha256=sha256, size=size, num_files=num_files)


def _check_bundle(path: str) -> int:
    """Unpack into a scratch dir, so a malicious archive is refused at upload."""
    scratch = tempfile.mkdtemp(prefix="air-bundle-check-")
    try:
        return unpack_bundle(Path(path), Path(scratch) / "x")
    except BundleError as exc:
        # Over the size or file-count limit: 413; unsafe or broken: 400.
        status = 413 if isinstance(exc, BundleTooLargeError) else 400
        raise HTTPException(status, f"bundle refused: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
    if idempotency_key is not None and not is_valid(IDEMPOTENCY_KEY, idempotency_key):
        raise HTTPException(
            400, "Idempotency-Key must be 1-200 printable ASCII characters (a uuid4 is fine)"
        )
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
    spec = parse_model(JobSpec, body, content_type)
    if spec.entrypoint is not None and spec.bundle_sha256 is None:
        raise HTTPException(
            400, "an entrypoint job needs its code: upload a bundle and set bundle_sha256"
        )
    if spec.bundle_sha256 and ctx.store.get_bundle(principal.tenant, spec.bundle_sha256) is None:
        raise HTTPException(
            400, f"bundle {spec.bundle_sha256} was not uploaded: PUT it to /v1/bundles first"
        )
    inventory = ctx.runner.backend.inventory()
    never = fits_ever(spec_request("new", spec), inventory)
    if never is not None:
        raise HTTPException(400, never)
    too_big = submit_refusal(spec, [n.accelerator for n in inventory if n.num_gpus])
    if too_big is not None:
        raise HTTPException(400, too_big)
    try:
        job, created = ctx.store.create_job(
            spec, tenant=principal.tenant, idempotency_key=idempotency_key
        )
    except IdempotencyConflict as exc:
        raise HTTPException(
            422, "this Idempotency-Key was used with a different job spec: use a new key"
        ) from exc
    if created:
        ctx.runner.wake()
    else:
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
    after: Annotated[int, Query(ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> AsyncIterator[ServerSentEvent]:
    """Every event after `after` (or the Last-Event-ID a reconnecting client sends),
    then new ones as they happen; the stream ends once the job has ended."""
    ctx = get_ctx(request)
    if last_event_id and last_event_id.isdigit():
        after = max(after, int(last_event_id))
    while True:
        if ctx.store.last_seq(job_id) > after:
            events = await run_in_threadpool(ctx.store.read_events, job_id, after=after, limit=1000)
            for e in events:
                yield ServerSentEvent(raw_data=e.model_dump_json(), id=str(e.seq), event="event")
                after = e.seq
            continue
        job = await run_in_threadpool(ctx.store.get_job, job_id)
        if job is None or (job.state.terminal and ctx.store.last_seq(job_id) <= after):
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(SSE_POLL_S)


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


@router.get("/cluster", response_model=Inventory)
def cluster(ctx: CtxDep, principal: PrincipalDep) -> Inventory:
    held = ctx.runner.held_placements()
    nodes = []
    for n in ctx.runner.backend.inventory():
        mine = [(p.job_id, a) for p in held for a in p.nodes if a.node == n.name]
        nodes.append(
            NodeInfo(
                name=n.name,
                pool=n.pool,
                slots=n.slots,
                gpus=[GpuInfo(index=g) for g in n.gpus],
                used_slots=sum(a.slots for _, a in mine),
                used_gpus=sorted(g for _, a in mine for g in a.gpus),
                healthy=n.healthy,
                jobs=sorted({j for j, _ in mine}),
            )
        )
    return Inventory(nodes=nodes)


# ---- workers ------------------------------------------------------------------------------


@worker_router.post("/jobs/{job_id}/attempts/{attempt}/report", status_code=204)
async def worker_report(job_id: str, attempt: int, request: Request) -> Response:
    """Batched metrics, log lines, heartbeats and exits from one rank, authenticated by
    the attempt's worker token; posts of an older attempt are fenced off (409)."""
    ctx = get_ctx(request)
    token = bearer_token(request)
    if token is None or not is_valid(JOB_ID, job_id):
        raise HTTPException(401, "a worker report needs the attempt's AIR_JOB_TOKEN")
    body = await request.body()
    # One hop to a worker thread for the whole report: the profile of this route had
    # two hand-offs per report as its largest single cost (23%).
    await run_in_threadpool(_ingest_report, ctx, job_id, attempt, token, body)
    return Response(status_code=204)


def _ingest_report(ctx: GatewayContext, job_id: str, attempt: int, token: str, body: bytes) -> None:
    verdict = ctx.store.check_worker_token(job_id, attempt, token)
    if verdict == "invalid":
        raise HTTPException(401, "the worker token does not belong to this job and attempt")
    if verdict == "stale":
        raise HTTPException(409, f"attempt {attempt} is no longer current; stop posting")
    try:
        report = WorkerReport.model_validate_json(body)
    except ValidationError as exc:
        raise HTTPException(422, f"not a WorkerReport: {describe_validation_error(exc)}") from None
    if report.lines or report.exit is not None or report.checkpoints or report.result is not None:
        report = _scrubbed(report, ctx.store.job_redactor(job_id, extra=(token,)))
    for record in report.checkpoints:
        if isinstance(record, CheckpointRestore):
            ctx.store.set_resumed_from(job_id, attempt, record.step)
    step = report.heartbeat_step
    if step is None and report.points:
        step = report.points[-1].step
    progress = bool(report.points) or report.heartbeat_step is not None
    active = bool(report.lines) or report.busy
    ctx.store.append_worker_events(
        job_id,
        attempt,
        report.rank,
        report.payloads(),
        step,
        progress=progress,
        active=active,
        finished=report.finished,
    )


def _scrubbed(report: WorkerReport, redactor: Redactor) -> WorkerReport:
    """The report with the job's secret env values and any token replaced in its text
    (output lines, exit tails, checkpoint records, a function's error), before anything
    is stored; a function's return value holding one is refused (`_scrubbed_result`)."""
    update: dict[str, object] = {}
    if report.lines:
        update["lines"] = redactor.lines(report.lines)
    if report.exit is not None and report.exit.tail:
        update["exit"] = report.exit.model_copy(update={"tail": redactor.lines(report.exit.tail)})
    if report.checkpoints:
        update["checkpoints"] = [
            type(c).model_validate(redactor.value(c.model_dump(mode="json")))
            for c in report.checkpoints
        ]
    if report.result is not None:
        update["result"] = _scrubbed_result(report.result, redactor)
    return report.model_copy(update=update) if update else report


def _scrubbed_result(result: FunctionResult, redactor: Redactor) -> FunctionResult:
    """A function's error texts scrubbed; a return value holding a secret is refused
    (a pickle cannot be edited), so it never reaches the event log."""
    if result.value_b64:
        try:
            raw = base64.b64decode(result.value_b64, validate=True)
        except binascii.Error as exc:
            raise HTTPException(422, f"result.value_b64 is not base64: {exc}") from exc
        text = raw.decode("latin-1")  # byte for byte, so an ASCII secret is found as is
        if redactor.text(text) != text:
            raise HTTPException(
                422,
                "the return value holds a secret of the job's environment or an AIR token;"
                " return something else (read secrets from os.environ where they are used)",
            )
    update = {
        key: redactor.text(text)
        for key, text in (("error", result.error), ("traceback", result.traceback))
        if text
    }
    return result.model_copy(update=update) if update else result
