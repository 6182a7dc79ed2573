"""Ingesting a worker report in two steps: `prepare_report` checks the attempt's token
and fencing, parses the report and scrubs every secret of the job and any AIR token
from its text (a function's return value holding one is refused: a pickle cannot be
edited); `store_report` writes it inside the transaction that commits it
(`report_writer.ReportWriter` runs both).

The body is JSON or msgpack (`air_sdk.gateway.services.report_body`); a msgpack
report's points are stored as the columns they came in (`PointColumns.stored`),
and read back as the same `metrics` event a JSON report's points make.

Example:
    >>> prepared = prepare_report(ctx, "train-5d41402a", 1, token, body, "application/msgpack")  # doctest: +SKIP
    >>> store_report(ctx, prepared)  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from air_sdk.errors import ApiError, AuthError, ConflictError
from air_sdk.gateway.services.report_body import parse_report
from air_sdk.redact import Redactor
from air_sdk.schema import FunctionResult, WorkerReport
from air_sdk.schema.columns import SerializedMetrics
from air_sdk.schema.events import CheckpointCommit, CheckpointRestore, EventPayload, MetricsBatch

if TYPE_CHECKING:
    from air_sdk.gateway.app import GatewayContext

__all__ = [
    "PreparedReport",
    "prepare_report",
    "scrubbed",
    "scrubbed_result",
    "store_report",
]


@dataclass(frozen=True, slots=True)
class PreparedReport:
    """A report checked, parsed and scrubbed, ready to be stored (`store_report`): what
    the report's transaction writes, and nothing it still has to read."""

    job_id: str
    attempt: int
    token: str
    rank: int
    #: the events to append, scrubbed (a binary report's points as one SerializedMetrics)
    items: list[EventPayload | SerializedMetrics]
    #: the rank's heartbeat step (the report's own, else its last point's)
    step: int | None
    progress: bool
    active: bool
    finished: bool
    #: the steps of the checkpoints the rank restored from
    restored: tuple[int, ...]
    num_points: int
    blocked_s: tuple[float, ...]
    body_format: str
    #: `time.perf_counter()` when the report's ingest began
    began: float


def _check_token(ctx: GatewayContext, job_id: str, attempt: int, token: str) -> None:
    verdict = ctx.store.check_worker_token(job_id, attempt, token)
    if verdict == "invalid":
        raise AuthError(401, "the worker token does not belong to this job and attempt")
    if verdict == "stale":
        raise ConflictError(409, f"attempt {attempt} is no longer current; stop posting")


def prepare_report(
    ctx: GatewayContext,
    job_id: str,
    attempt: int,
    token: str,
    body: bytes,
    content_type: str | None = "application/json",
) -> PreparedReport:
    """The report's token and fencing checked, its body parsed and its text scrubbed:
    everything but the writes, so it runs on the event loop while another thread
    writes: an `AuthError` (401) for a token not of this job and attempt, a
    `ConflictError` (409) for an attempt no longer current, an `ApiError` (422) for a
    body that is not a `WorkerReport` or a result holding a secret, (415) for a
    Content-Type that is neither JSON nor msgpack."""
    began = time.perf_counter()
    _check_token(ctx, job_id, attempt, token)
    parsed = parse_report(body, content_type)
    report = parsed.report
    shard = report.data.waiting_shard if report.data is not None else None
    has_text = report.lines or report.checkpoints or shard
    if has_text or report.exit is not None or report.result is not None:
        report = scrubbed(report, ctx.store.job_redactor(job_id, extra=(token,)))
    step = report.heartbeat_step
    if step is None:
        step = parsed.last_step
    items: list[EventPayload | SerializedMetrics] = list(report.payloads())
    if parsed.columns is not None:  # stored as columns; read back as a MetricsBatch's points
        data_json = report.data.model_dump_json() if report.data is not None else "null"
        metrics = parsed.columns.stored(dropped_points=report.dropped_points, data_json=data_json)
        items = [metrics, *(p for p in items if not isinstance(p, MetricsBatch))]
    return PreparedReport(
        job_id=job_id,
        attempt=attempt,
        token=token,
        rank=report.rank,
        items=items,
        step=step,
        progress=parsed.num_points > 0 or report.heartbeat_step is not None,
        active=bool(report.lines) or report.busy,
        finished=report.finished,
        restored=tuple(c.step for c in report.checkpoints if isinstance(c, CheckpointRestore)),
        num_points=parsed.num_points,
        blocked_s=tuple(c.blocked_s for c in report.checkpoints if isinstance(c, CheckpointCommit)),
        body_format=parsed.body_format,
        began=began,
    )


def store_report(ctx: GatewayContext, report: PreparedReport, *, may_trim: bool = True) -> None:
    """Write a prepared report: its token and fencing checked again, as the
    transaction sees them (an attempt may have ended since `prepare_report`), then its
    events and heartbeat appended, undone together if any of it fails. Inside a group's
    transaction (`Database.batch`) it is a savepoint of it. With `may_trim` False, a
    report that takes the job past a storage quota raises `TrimNeeded` (nothing of it
    is stored) instead of deleting the job's oldest events."""
    _check_token(ctx, report.job_id, report.attempt, report.token)
    if report.restored:  # two writes: undone together (one savepoint) if the second fails
        with ctx.store.batch():
            for step in report.restored:
                ctx.store.set_resumed_from(report.job_id, report.attempt, step)
            _append(ctx, report, may_trim=may_trim)
    else:  # one write: its own savepoint inside a group's transaction
        _append(ctx, report, may_trim=may_trim)
    if ctx.metrics is not None:  # one observation per report, never per point
        ctx.metrics.observe_report(
            num_points=report.num_points,
            blocked_s=list(report.blocked_s),
            seconds=time.perf_counter() - report.began,
            body_format=report.body_format,
        )


def _append(ctx: GatewayContext, report: PreparedReport, *, may_trim: bool) -> None:
    ctx.store.append_worker_events(
        report.job_id,
        report.attempt,
        report.rank,
        report.items,
        report.step,
        progress=report.progress,
        active=report.active,
        finished=report.finished,
        may_trim=may_trim,
    )


def scrubbed(report: WorkerReport, redactor: Redactor) -> WorkerReport:
    """The report with the job's secret env values and any token replaced in its text
    (output lines, exit tails, checkpoint records, a function's error, the name of the
    shard a rank waits for), before anything
    is stored; a function's return value holding one is refused (`scrubbed_result`)."""
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
        update["result"] = scrubbed_result(report.result, redactor)
    if report.data is not None and report.data.waiting_shard:  # a name the job chose
        shard = redactor.text(report.data.waiting_shard)
        update["data"] = report.data.model_copy(update={"waiting_shard": shard})
    return report.model_copy(update=update) if update else report


def scrubbed_result(result: FunctionResult, redactor: Redactor) -> FunctionResult:
    """A function's error texts scrubbed; a return value holding a secret is refused
    (a pickle cannot be edited), so it never reaches the event log."""
    if result.value_b64:
        try:
            raw = base64.b64decode(result.value_b64, validate=True)
        except binascii.Error as exc:
            raise ApiError(422, f"result.value_b64 is not base64: {exc}") from exc
        text = raw.decode("latin-1")  # byte for byte, so an ASCII secret is found as is
        if redactor.text(text) != text:
            raise ApiError(
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
