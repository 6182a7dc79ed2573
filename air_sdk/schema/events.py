"""The per-job, append-only event log: what every reader (CLI, SDK, widget) folds.

Each event has a per-job sequence number starting at 1 with no gaps, so a reader
that reconnects asks for `after=<last seq it saw>` and misses nothing. (The one
exception: past a job's storage quota the oldest `log` and `metrics` events are
deleted, and an `alert` of kind `quota` says so; see `air_sdk.store.quota`.)
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from air_sdk.schema._guards import WireModel
from air_sdk.schema.state import JobState

MAX_POINTS_PER_REPORT = 10_000
MAX_LOG_LINES_PER_REPORT = 10_000
MAX_LOG_LINE_CHARS = 16_384


class EventType(str, Enum):
    STATE = "state"  # data: StateChange
    ATTEMPT = "attempt"  # data: AttemptChange
    METRICS = "metrics"  # data: {"points": [MetricPoint...]}, rank set
    LOG = "log"  # data: {"lines": [str...]}, rank set
    RANK_EXIT = "rank_exit"  # data: RankExit, rank set
    CHECKPOINT = "checkpoint"  # data: CheckpointCommit, or CheckpointSkip (has "skipped")
    UTIL = "util"  # data: {"samples": [DeviceSample...]}, rank set (a node's sampler)
    ALERT = "alert"  # data: {"kind": "straggler" | ..., "detail": str}, rank maybe set


class Event(BaseModel):
    """One entry of a job's event log.

    Example:
        >>> Event(seq=1, job_id="j", ts=0.0, type="state", data={"state": "QUEUED"}).type
        <EventType.STATE: 'state'>
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    seq: int = Field(ge=1)
    job_id: str
    ts: float
    type: EventType
    attempt: int | None = None
    rank: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class StateChange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state: JobState
    previous: JobState | None = None
    reason: str = ""


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


class AttemptChange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    attempt: int
    phase: Literal["started", "ended"]
    placement: Placement | None = None
    reason: str = ""
    resumed_from_step: int | None = None


class MetricPoint(BaseModel):
    """One `air.log(step=..., **values)` call. NaN and infinities survive (a diverging
    loss is worth seeing), written as the JSON constants Python reads back.

    Not a `WireModel`: its check would be a Python call per point on the ingest path;
    the gateway bounds what a bad report's errors cost instead (`gateway.errors`)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    step: int
    ts: float
    values: dict[str, float]


class RankExit(WireModel):
    """How one rank's process ended, as seen by its supervisor."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int
    node: str | None = None
    #: wall time the process ended (which rank died first decides who is blamed)
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    oom_killed: bool = False
    tail: list[str] = Field(default_factory=list, max_length=MAX_LOG_LINES_PER_REPORT)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        if self.signal:
            how = f"killed by {self.signal}" + (" (out of memory)" if self.oom_killed else "")
        else:
            how = f"exit code {self.exit_code}"
        return f"rank {self.rank} {how}"


class DeviceSample(BaseModel):
    """Utilization of one device of one node at one time: a GPU (nvidia-ml-py) or, where
    there is none, the node's CPU and memory (psutil)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    node: str
    #: "gpu0", "gpu1", ... or "cpu"
    device: str
    ts: float
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None


class CheckpointCommit(WireModel):
    """One committed checkpoint, reported by rank 0 once its manifest is in place.

    Example:
        >>> CheckpointCommit(step=100, path="/ckpt/step-100", world_size=2, size_bytes=10,
        ...                  num_files=3, blocked_s=0.05, durable_s=1.5).step
        100
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    step: int = Field(ge=0)
    path: str
    world_size: int = Field(ge=1)
    size_bytes: int = Field(ge=0)
    num_files: int = Field(ge=0)
    blocked_s: float = Field(description="Seconds the training loop waited in save().")
    durable_s: float = Field(description="Seconds from save() until the manifest was in place.")
    attempt: int = 0
    snapshot: Literal["copy", "fork"] | None = Field(
        default=None, description="How save() took its snapshot (AIR_CHECKPOINT_SNAPSHOT)."
    )
    at_failure: bool = Field(
        default=False,
        description="Written by a surviving rank when a peer failed (AIR_CHECKPOINT_ON_FAILURE).",
    )


class CheckpointSkip(WireModel):
    """A committed checkpoint that restore passed over (its files do not match its manifest).

    Example:
        >>> CheckpointSkip(step=6, path="/ckpt/step-6", skipped="__1_0.distcp: missing").step
        6
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=0)
    path: str
    skipped: str = Field(description="Why, e.g. 'file X does not match its manifest'.")
    attempt: int = 0


class CheckpointRestore(WireModel):
    """The checkpoint an attempt resumed from, reported by rank 0 after a load.

    Example:
        >>> CheckpointRestore(step=40, path="/ckpt/step-40", restored=True).step
        40
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=0)
    path: str
    restored: Literal[True] = True
    attempt: int = 0


class WorkerReport(WireModel):
    """What a rank (its runtime or its supervisor) posts to the gateway, batched.

    Posted to `POST /v1/jobs/{job_id}/attempts/{attempt}/report` with the
    attempt's worker token. Any subset of the fields may be set.
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    rank: int = Field(ge=0)
    points: list[MetricPoint] = Field(default_factory=list, max_length=MAX_POINTS_PER_REPORT)
    lines: list[str] = Field(default_factory=list, max_length=MAX_LOG_LINES_PER_REPORT)
    exit: RankExit | None = None
    samples: list[DeviceSample] = Field(default_factory=list, max_length=1000)
    heartbeat_step: int | None = None
    dropped_points: int = Field(0, ge=0, description="Points dropped on the worker (buffer full).")
    checkpoints: list[CheckpointCommit | CheckpointSkip | CheckpointRestore] = Field(
        default_factory=list, max_length=100
    )
