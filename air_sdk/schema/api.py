"""Request and response bodies of the gateway's HTTP API (`/v1/...`).

Routes (all but `/v1/health` need `Authorization: Bearer <token>`):

| method | path                                         | body / query            | answer       |
|--------|----------------------------------------------|-------------------------|--------------|
| GET    | /v1/health                                   |                         | Health       |
| HEAD   | /v1/bundles/{sha256}                         |                         | 200 / 404    |
| PUT    | /v1/bundles/{sha256}                         | tar.gz bytes            | BundleInfo   |
| POST   | /v1/jobs  (header Idempotency-Key)           | JobSpec                 | JobRecord    |
| GET    | /v1/jobs                                     | ?state=&limit=          | JobList      |
| GET    | /v1/jobs/{id}                                |                         | JobRecord    |
| POST   | /v1/jobs/{id}/cancel                         |                         | JobRecord    |
| GET    | /v1/jobs/{id}/attempts                       |                         | AttemptList  |
| GET    | /v1/jobs/{id}/events                         | ?after=&limit=&wait=&type= | EventPage |
| GET    | /v1/jobs/{id}/events/stream                  | ?after= / Last-Event-ID | SSE of Event |
| GET    | /v1/jobs/{id}/logs                 | ?rank=&attempt=&after=&limit=&tail=&before= | LogPage |
| GET    | /v1/jobs/{id}/metrics                        | ?name=&rank=&after=&limit= | MetricsPage |
| GET    | /v1/jobs/{id}/checkpoints                    |                         | CheckpointList |
| POST   | /v1/jobs/{id}/attempts/{n}/report            | WorkerReport (worker)   | 204          |
| GET    | /v1/cluster                                  |                         | Inventory    |
| *      | /v1/admin/... (tenants, tokens, nodes)       | see `schema/admin.py`   |              |

A viewer token may only GET and HEAD; another tenant's job is a 404 like a
missing one; every error body is an `ErrorBody`. See docs/security.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from air_sdk.schema.admin import NodeProbe
from air_sdk.schema.data import DataLoadingSummary
from air_sdk.schema.events import (
    CheckpointCommit,
    CheckpointRestore,
    CheckpointSkip,
    Event,
    ExportStatus,
    FailureInfo,
    FailureKind,
    MetricsBatch,
    Placement,
)
from air_sdk.schema.numbers import NON_FINITE
from air_sdk.schema.spec import JobSpec
from air_sdk.schema.state import JobState

__all__ = [
    "AttemptList",
    "AttemptRecord",
    "BundleInfo",
    "CheckpointList",
    "ErrorBody",
    "EventPage",
    "FailureInfo",
    "FailureKind",
    "GpuInfo",
    "Health",
    "Inventory",
    "JobList",
    "JobRecord",
    "JobStatus",
    "LogLine",
    "LogPage",
    "MetricRow",
    "MetricsPage",
    "NodeInfo",
]


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)


class Health(_Wire):
    status: Literal["ok"] = "ok"
    version: str


class BundleInfo(_Wire):
    sha256: str
    size: int
    num_files: int


class JobRecord(_Wire):
    """A job as the gateway knows it."""

    id: str
    tenant: str
    name: str
    state: JobState
    state_reason: str = ""
    spec: JobSpec
    created_at: float
    updated_at: float
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0
    num_restarts: int = 0
    #: restarts that used the `max_restarts` budget (preemptions and gateway restarts do not)
    charged_restarts: int = 0
    failure: FailureInfo | None = None
    cancel_requested: bool = False
    #: a queued job's place in its pool's line (1: next to start there)
    queue_position: int | None = None
    #: why a queued job waits: quota, no such pool or accelerator, gang does not fit,
    #: behind N jobs, held for a backfill reservation, preempting ...
    queue_reason: str | None = None
    #: productive training time / wall time, from the attempts' progress and checkpoints
    goodput: float | None = None
    #: what goodput divides: seconds of training whose work was kept, and the wall time
    #: from the first attempt's launch to the end (or now); the rest is start-up and loss
    productive_s: float | None = None
    wall_s: float | None = None


class JobStatus(JobRecord):
    """`air status --json`: the job record and what its event log adds.

    Example:
        >>> JobStatus.model_fields["step"].default is None
        True
    """

    #: the latest step the job logged (`air.log`), as its snapshot folds it; None before any
    step: int | None = None
    #: tracker -> where the gateway exports the job and how it went (`--export`)
    exports: dict[str, ExportStatus] = Field(default_factory=dict)
    #: samples/s, data-wait share and cache hits (`JobSnapshot.data_summary`); None when
    #: no rank counts data loading (`air.data.timed`)
    data_loading: DataLoadingSummary | None = None


class JobList(_Wire):
    jobs: list[JobRecord]


class AttemptRecord(_Wire):
    job_id: str
    attempt: int
    placement: Placement
    started_at: float
    ended_at: float | None = None
    reason: str = ""
    failure: FailureInfo | None = None
    resumed_from_step: int | None = None
    #: seconds of this attempt whose work was kept / was not (launch, redone work, teardown)
    productive_s: float | None = None
    time_lost_s: float | None = None


class AttemptList(_Wire):
    attempts: list[AttemptRecord]


class EventPage(_Wire):
    events: list[Event]
    #: pass as `after` to get the next page
    last_seq: int
    state: JobState


class LogLine(_Wire):
    attempt: int
    rank: int
    text: str


class LogPage(_Wire):
    """A page of log lines, in order. Forward: pass `last_seq` as `after` for the next
    page while `more`. With `tail`: the newest lines; while `more`, pass `first_seq` as
    `before` for the older ones (`air_sdk.store.pages`)."""

    lines: list[LogLine]
    #: the event sequence number of the newest line's report (follow on from here)
    last_seq: int
    #: ... and of the oldest one's
    first_seq: int = 0
    #: the page was cut by its size: there are more lines to ask for
    more: bool = False


class MetricRow(_Wire):
    attempt: int
    rank: int
    step: int
    ts: float
    values: dict[str, float]


class MetricsPage(_Wire):
    """A page of metric points, in order: pass `last_seq` as `after` for the next one
    while `more`.

    Example:
        >>> point = {"step": 1, "ts": 0.0, "values": {"loss": 2.0, "lr": 0.1}}
        >>> e = Event(seq=2, job_id="j", ts=0, type="metrics", attempt=1, rank=0, data={"points": [point]})
        >>> MetricsPage.from_events([e], name="loss").points[0].values
        {'loss': 2.0}
    """

    points: list[MetricRow]
    last_seq: int = 0
    more: bool = False

    @classmethod
    def from_events(cls, events: Iterable[Event], *, name: str | None = None) -> MetricsPage:
        """The points of `metrics` events; with `name`, only rows that hold it, only it."""
        rows = []
        for e in events:
            for p in e.payload_as(MetricsBatch).points:
                values = p.values
                if name is not None:
                    if name not in values:
                        continue
                    values = {name: values[name]}
                rows.append(
                    MetricRow(
                        attempt=e.attempt or 0,
                        rank=e.rank or 0,
                        step=p.step,
                        ts=p.ts,
                        values=values,
                    )
                )
        return cls(points=rows)


class CheckpointList(_Wire):
    """A job's checkpoints: committed ones (oldest first), the ones restore passed
    over, and which step each attempt resumed from."""

    commits: list[CheckpointCommit]
    skipped: list[CheckpointSkip] = Field(default_factory=list)
    restores: list[CheckpointRestore] = Field(default_factory=list)

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> CheckpointList:
        """The records of `checkpoint` events, sorted into the three lists.

        Example:
            >>> e = Event(seq=5, job_id="j", ts=0, type="checkpoint",
            ...           data={"step": 6, "path": "/c/6", "skipped": "sha256 mismatch"})
            >>> CheckpointList.from_events([e]).skipped[0].step
            6
        """
        commits, skipped, restores = [], [], []
        for e in events:
            match e.payload():
                case CheckpointCommit() as commit:
                    commits.append(commit.recorded_at(e.ts))
                case CheckpointSkip() as skip:
                    skipped.append(skip)
                case CheckpointRestore() as restore:
                    restores.append(restore)
        return cls(commits=commits, skipped=skipped, restores=restores)


class GpuInfo(_Wire):
    index: int
    name: str = ""
    memory_mib: int = 0


class NodeInfo(_Wire):
    name: str
    pool: str = "default"
    slots: int
    gpus: list[GpuInfo] = Field(default_factory=list)
    used_slots: int = 0
    used_gpus: list[int] = Field(default_factory=list)
    healthy: bool = True
    jobs: list[str] = Field(default_factory=list)
    #: the operator's health probe's last result here (None without a probe)
    probe: NodeProbe | None = None


class Inventory(_Wire):
    nodes: list[NodeInfo]


class ErrorBody(_Wire):
    """The body of every error answer: `detail` says what to change."""

    detail: str
