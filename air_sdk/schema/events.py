"""The per-job, append-only event log: what every reader (CLI, SDK, widget) folds.

Each event has a per-job sequence number starting at 1 with no gaps, so a reader
that reconnects asks for `after=<last seq it saw>` and misses nothing. (The one
exception: past a job's storage quota the oldest `log` and `metrics` events are
deleted, and an `alert` of kind `quota` says so; see `air_sdk.store.quota`.)

Every event type has one payload model here, and events are written and read
through it (never as dicts by key):

| `EventType`  | payload (`Event.payload()`)                                 | written by         |
|--------------|-------------------------------------------------------------|--------------------|
| `state`      | `StateChange` (with `FailureInfo` on a failure)             | the store          |
| `attempt`    | `AttemptChange` (phase started / ended)                     | the store          |
| `metrics`    | `MetricsBatch` (`MetricPoint`s, `DataLoading`), rank set    | worker reports     |
| `log`        | `LogBatch` (lines), rank set                                | worker reports     |
| `rank_exit`  | `RankExit`, rank set                                        | worker reports     |
| `checkpoint` | `CheckpointCommit`, `CheckpointSkip` or `CheckpointRestore` | worker reports     |
| `util`       | `UtilBatch` (`DeviceSample`s), rank set                     | worker reports     |
| `alert`      | `Alert` (straggler, reattached, ...)                        | the runner         |
| `result`     | `FunctionResult` (an `@air_sdk.distributed` call), rank set | worker reports     |
| `export`     | `ExportStatus` (where a tracker export goes, done, failed)  | the export service |
| `slo`        | `SloBurn` (a tenant's SLO burned its budget past a threshold, or recovered) | the runner |

On the wire and in the store an event's `data` is the payload's JSON, as it
always was, so stored rows read back unchanged. A reader ignores fields it does
not know (a newer gateway may add some); a writer cannot add one by mistake.

Example:
    >>> event = Event.of(StateChange(state=JobState.RUNNING), seq=2, job_id="j", ts=0.0)
    >>> event.type, event.data["state"]
    (<EventType.STATE: 'state'>, 'RUNNING')
    >>> event.payload().state
    <JobState.RUNNING: 'RUNNING'>
"""

from __future__ import annotations

import builtins
from enum import Enum
from typing import Any, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from air_sdk.schema._guards import WireModel
from air_sdk.schema.checkpoint_records import CheckpointCommit as CheckpointCommit
from air_sdk.schema.checkpoint_records import CheckpointRestore as CheckpointRestore
from air_sdk.schema.checkpoint_records import CheckpointSkip as CheckpointSkip
from air_sdk.schema.data import DataLoading
from air_sdk.schema.export import ExportStatus as ExportStatus
from air_sdk.schema.numbers import NON_FINITE, json_data
from air_sdk.schema.slo import SloBurn
from air_sdk.schema.state import JobState, show_value

MAX_POINTS_PER_REPORT = 10_000
MAX_LOG_LINES_PER_REPORT = 10_000
MAX_LOG_LINE_CHARS = 16_384
#: the largest pickled return value rank 0 of an `@air_sdk.distributed` call may post; a
#: report carries it base64-encoded (4/3 of it: 2.7 MiB) and the gateway takes reports of
#: 4 MiB (`air_sdk.gateway_config.RequestLimits.max_report_bytes`)
MAX_RESULT_BYTES = 2 << 20
#: a failing rank's traceback is cut to its last this many characters
MAX_TRACEBACK_CHARS = 64 << 10


class EventType(str, Enum):
    """What an event says; its payload model is in the module's table. `str()`, f-strings
    and a notebook cell show the value (`state`), as JobState does."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    STATE = "state"
    ATTEMPT = "attempt"
    METRICS = "metrics"
    LOG = "log"
    RANK_EXIT = "rank_exit"
    CHECKPOINT = "checkpoint"
    UTIL = "util"
    ALERT = "alert"
    RESULT = "result"
    EXPORT = "export"
    SLO = "slo"


EventType._repr_pretty_ = show_value  # type: ignore[attr-defined]


class _Payload(WireModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)


# ---- where a job runs ---------------------------------------------------------------------


class NodeAssignment(BaseModel):
    """One node of a placement: which node, how many rank slots and which GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    slots: int = Field(ge=1)
    gpus: tuple[int, ...] = ()


class Placement(BaseModel):
    """Where a job runs: one assignment per job node, all granted at once (gang)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    nodes: tuple[NodeAssignment, ...]
    pool: str = "default"


# ---- how ranks and attempts end -----------------------------------------------------------


class RankExit(_Payload):
    """How one rank's process ended, as seen by its supervisor (a `rank_exit` event).

    Example:
        >>> RankExit(rank=1, exit_code=3).describe()
        'rank 1 exit code 3'
    """

    rank: int
    node: str | None = None
    #: wall time the process ended (which rank died first decides who is blamed)
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    oom_killed: bool = False
    tail: list[str] = Field(default_factory=list, max_length=MAX_LOG_LINES_PER_REPORT)
    #: the job's limit it went past, with the numbers (`JobSpec.limits`), when that is
    #: why it ended: "memory limit: job used 300 MiB > limit 64 MiB (...)"
    limit: str | None = Field(None, max_length=1000)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        if self.limit:
            return self.limit
        if self.signal:
            how = f"killed by {self.signal}" + (" (out of memory)" if self.oom_killed else "")
        else:
            how = f"exit code {self.exit_code}"
        return f"rank {self.rank} {how}"


FailureKind = Literal[
    "crash",
    "oom",
    "hang",
    "lost_node",
    "preempted",
    "timeout",
    "startup",
    "gateway",
    "internal",
    "limit",
]


class FailureInfo(_Payload):
    """Why an attempt (and so perhaps the job) failed: the first failing rank.

    Example:
        >>> FailureInfo(attempt=1, reason="worker crashed", rank=1, exit_code=3).kind
        'crash'
    """

    attempt: int
    reason: str
    kind: FailureKind = "crash"
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    log_tail: list[str] = Field(default_factory=list)
    rank_exits: list[RankExit] = Field(default_factory=list)
    #: hangs: the ranks that stopped progressing, and every rank's Python stack
    stalled_ranks: list[int] = Field(default_factory=list)
    stacks: dict[int, str] = Field(default_factory=dict)
    #: hangs of GPU jobs: each rank's last collectives, from torch's flight recorder
    collectives: dict[int, list[str]] = Field(default_factory=dict)
    #: False for failures not charged to the restart budget (preemption, a lost gateway)
    charged: bool = True
    #: when the failure happened, as far as the runner can tell: the first failing rank's
    #: exit (a crash), the moment progress stopped (a hang), the node's last heartbeat (a
    #: lost node); None when it cannot tell. The `time_to_detect` SLO measures from it.
    failed_at: float | None = None
    #: when the runner gave its verdict (before it tore the attempt down)
    detected_at: float | None = None


# ---- control-plane events -----------------------------------------------------------------


class StateChange(_Payload):
    """A job moved to `state` (a `state` event); `failure` says why when it failed.

    Example:
        >>> StateChange(state=JobState.QUEUED, reason="submitted").previous is None
        True
    """

    state: JobState
    previous: JobState | None = None
    reason: str = ""
    failure: FailureInfo | None = None


class AttemptChange(_Payload):
    """An attempt started (with its placement and the step it resumes from) or ended.

    Example:
        >>> AttemptChange(attempt=2, phase="ended", reason="rank 1 exit code 3").phase
        'ended'
    """

    attempt: int
    phase: Literal["started", "ended"]
    placement: Placement | None = None
    reason: str = ""
    resumed_from_step: int | None = None


class Alert(_Payload):
    """Something a person should notice that is not a state change: a straggling
    rank, a gateway that re-attached to a running attempt.

    Example:
        >>> Alert(kind="straggler", rank=3, detail="rank 3 is slow").kind
        'straggler'
    """

    kind: str
    detail: str = ""
    rank: int | None = None
    #: the event type the alert is about (a `quota` alert: `log` or `metrics`)
    of: str | None = None


# ---- what workers report ------------------------------------------------------------------


class MetricPoint(BaseModel):
    """One `air.log(step=..., **values)` call. NaN and infinities survive (a diverging
    loss is worth seeing), written as the strings "NaN", "Infinity" and "-Infinity"
    (`air_sdk.schema.numbers`)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan=NON_FINITE)

    step: int
    ts: float
    values: dict[str, float]


class MetricsBatch(_Payload):
    """The points of one worker report (a `metrics` event; the event's rank logged them).

    Example:
        >>> MetricsBatch(points=[MetricPoint(step=1, ts=0.0, values={"loss": 2.5})]).points[0].step
        1
    """

    points: list[MetricPoint] = Field(default_factory=list)
    #: points the worker dropped because its buffer was full
    dropped_points: int = Field(0, ge=0)
    #: the rank's data-loading totals at this report (`air_sdk.schema.data`), if it counts
    data: DataLoading | None = None


class LogBatch(_Payload):
    """Output lines of one rank (a `log` event), already redacted by the gateway.

    Example:
        >>> LogBatch(lines=["step 1"]).lines
        ['step 1']
    """

    lines: list[str] = Field(default_factory=list)


class DeviceSample(BaseModel):
    """Utilization of one device of one node at one time: a GPU (nvidia-ml-py) or, where
    there is none, the node's CPU and memory (psutil)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan=NON_FINITE)

    node: str
    #: "gpu0", "gpu1", ... or "cpu"
    device: str
    ts: float
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None


class UtilBatch(_Payload):
    """Device samples of one node's sampler (a `util` event).

    Example:
        >>> UtilBatch(samples=[DeviceSample(node="n0", device="cpu", ts=0.0)]).samples[0].device
        'cpu'
    """

    samples: list[DeviceSample] = Field(default_factory=list)


# ---- how a function call ended ------------------------------------------------------------


class FunctionResult(_Payload):
    """How an `@air_sdk.distributed` function ended on one rank (a `result` event):
    rank 0 posts its return value (cloudpickle, base64), any rank that raised posts the
    exception and its traceback. Read back by `Job.result()`.

    Example:
        >>> FunctionResult(ok=False, error_type="ValueError", error="bad lr").ok
        False
    """

    ok: bool = Field(description="True: the function returned; False: it raised.")
    value_b64: str | None = Field(
        None,
        max_length=(MAX_RESULT_BYTES + 2) // 3 * 4,
        description="Rank 0's return value: cloudpickle bytes, base64 (standard alphabet).",
    )
    size_bytes: int = Field(0, ge=0, le=MAX_RESULT_BYTES, description="Pickled size.")
    error_type: str | None = Field(None, max_length=300, description="e.g. 'ValueError'.")
    error: str | None = Field(
        None, max_length=MAX_LOG_LINE_CHARS, description="str() of the exception."
    )
    traceback: str | None = Field(
        None, max_length=MAX_TRACEBACK_CHARS, description="As the rank printed it."
    )


#: what a `checkpoint` event holds
CheckpointRecord: TypeAlias = CheckpointCommit | CheckpointSkip | CheckpointRestore

#: the payload of any event
EventPayload: TypeAlias = (
    StateChange
    | AttemptChange
    | MetricsBatch
    | LogBatch
    | RankExit
    | CheckpointCommit
    | CheckpointSkip
    | CheckpointRestore
    | UtilBatch
    | Alert
    | FunctionResult
    | ExportStatus
    | SloBurn
)

#: event type -> the payload models it may hold (one, except checkpoints)
PAYLOAD_MODELS: dict[EventType, tuple[type[WireModel], ...]] = {
    EventType.STATE: (StateChange,),
    EventType.ATTEMPT: (AttemptChange,),
    EventType.METRICS: (MetricsBatch,),
    EventType.LOG: (LogBatch,),
    EventType.RANK_EXIT: (RankExit,),
    EventType.CHECKPOINT: (CheckpointCommit, CheckpointSkip, CheckpointRestore),
    EventType.UTIL: (UtilBatch,),
    EventType.ALERT: (Alert,),
    EventType.RESULT: (FunctionResult,),
    EventType.EXPORT: (ExportStatus,),
    EventType.SLO: (SloBurn,),
}
_TYPE_OF: dict[type[WireModel], EventType] = {
    model: etype for etype, models in PAYLOAD_MODELS.items() for model in models
}
_P = TypeVar("_P", bound=BaseModel)


def event_type_of(payload: EventPayload) -> EventType:
    """The event type a payload is written as.

    Example:
        >>> event_type_of(LogBatch(lines=["hi"]))
        <EventType.LOG: 'log'>
    """
    return _TYPE_OF[type(payload)]


def parse_payload(etype: EventType, data: dict[str, Any]) -> EventPayload:
    """`data` of an event of type `etype` as its payload model. Fields this version does
    not know are ignored (a newer gateway may add some); a missing one is an error.

    Example:
        >>> parse_payload(EventType.CHECKPOINT, {"step": 6, "path": "/c/6", "skipped": "bad"})
        CheckpointSkip(step=6, path='/c/6', skipped='bad', attempt=0)
    """
    model: type[EventPayload]
    if etype is EventType.CHECKPOINT:
        # The three records share `step` and `path`; a skip says why, a restore says so.
        if "skipped" in data:
            model = CheckpointSkip
        elif data.get("restored"):
            model = CheckpointRestore
        else:
            model = CheckpointCommit
    else:
        (model,) = PAYLOAD_MODELS[etype]  # type: ignore[assignment]
    return model.model_validate(data, extra="ignore")


# ---- the event ----------------------------------------------------------------------------


class Event(BaseModel):
    """One entry of a job's event log: its payload's JSON in `data`, typed by `payload()`.

    Example:
        >>> event = Event(seq=1, job_id="j", ts=0.0, type="log", rank=0, data={"lines": ["hi"]})
        >>> event.payload()
        LogBatch(lines=['hi'])
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)

    seq: int = Field(ge=1)
    job_id: str
    ts: float
    type: EventType
    attempt: int | None = None
    rank: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(
        cls,
        payload: EventPayload,
        *,
        seq: int,
        job_id: str,
        ts: float,
        attempt: int | None = None,
        rank: int | None = None,
    ) -> Event:
        """The event that carries `payload` (its type follows from the payload's model).

        Example:
            >>> Event.of(LogBatch(lines=["hi"]), seq=3, job_id="j", ts=0.0, rank=1).type
            <EventType.LOG: 'log'>
        """
        return cls(
            seq=seq,
            job_id=job_id,
            ts=ts,
            type=event_type_of(payload),
            attempt=attempt,
            rank=rank,
            data=json_data(payload),
        )

    def payload(self) -> EventPayload:
        """`data` as the payload model of this event's type (see `parse_payload`)."""
        return parse_payload(self.type, self.data)

    def payload_as(self, model: builtins.type[_P]) -> _P:
        """The payload, which must be a `model` (for readers that asked for one type).

        Example:
            >>> Event(seq=1, job_id="j", ts=0.0, type="log", data={"lines": []}).payload_as(LogBatch)
            LogBatch(lines=[])
        """
        payload = self.payload()
        if not isinstance(payload, model):
            raise ValueError(
                f"event {self.seq} of job {self.job_id} is a {self.type.value} event,"
                f" not a {model.__name__}"
            )
        return payload


class WorkerReport(WireModel):
    """What a rank (its runtime or its supervisor) posts to the gateway, batched.

    Posted to `POST /v1/jobs/{job_id}/attempts/{attempt}/report` with the
    attempt's worker token. Any subset of the fields may be set.

    Example:
        >>> report = WorkerReport(rank=0, lines=["step 1"], heartbeat_step=1)
        >>> [event_type_of(p).value for p in report.payloads()]
        ['log']
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan=NON_FINITE)

    rank: int = Field(ge=0)
    points: list[MetricPoint] = Field(default_factory=list, max_length=MAX_POINTS_PER_REPORT)
    lines: list[str] = Field(default_factory=list, max_length=MAX_LOG_LINES_PER_REPORT)
    exit: RankExit | None = None
    samples: list[DeviceSample] = Field(default_factory=list, max_length=1000)
    heartbeat_step: int | None = None
    dropped_points: int = Field(0, ge=0, description="Points dropped on the worker (buffer full).")
    checkpoints: list[CheckpointRecord] = Field(default_factory=list, max_length=100)
    #: an `@air_sdk.distributed` call ended on this rank: its value (rank 0) or its error
    result: FunctionResult | None = None
    #: the rank's processes used CPU (or its GPUs were busy) since its last report: its
    #: NodeRunner's reading, so that a script that never calls air.log is judged hung
    #: only when it prints nothing and uses nothing (docs/failure-handling.md)
    busy: bool = False
    #: the rank's runtime shut down (`air.shutdown()`, also at exit): the rank is leaving,
    #: so the hang timeout no longer applies to it (an exit grace does, see
    #: `air_sdk.runner.controller.EXIT_AFTER_FINISH_S`)
    finished: bool = False
    #: the rank's data-loading totals (`air.data.timed`, shard cache); in its metrics event
    data: DataLoading | None = None

    def payloads(self) -> list[EventPayload]:
        """The events this report becomes, in the order they are stored: metrics, log
        lines, device samples, checkpoint records, a function's result, and last the rank's
        exit (so a reader that sees the exit has seen the result)."""
        out: list[EventPayload] = []
        if self.points or self.dropped_points or self.data is not None:
            out.append(
                MetricsBatch(points=self.points, dropped_points=self.dropped_points, data=self.data)
            )
        if self.lines:
            out.append(LogBatch(lines=self.lines))
        if self.samples:
            out.append(UtilBatch(samples=self.samples))
        out.extend(self.checkpoints)
        if self.result is not None:
            out.append(self.result)
        if self.exit is not None:
            out.append(self.exit)
        return out
