"""JobSnapshot: the fold of a job's event log into what a person looks at.

Readers (CLI progress, the notebook monitor) keep one snapshot and `apply` each
new event; a reconnecting reader continues from `snapshot.last_seq`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from air_sdk.schema.api import FailureInfo
from air_sdk.schema.events import DeviceSample, Event, EventType, RankExit
from air_sdk.schema.state import JobState

#: points kept per metric name for charts; older points are thinned, not dropped at random
MAX_SERIES_POINTS = 2000


class JobSnapshot(BaseModel):
    """What is known about a job after folding its events up to `last_seq`.

    Example:
        >>> snap = JobSnapshot(job_id="j")
        >>> snap.apply(Event(seq=1, job_id="j", ts=1.0, type="state", data={"state": "RUNNING"}))
        >>> snap.state
        <JobState.RUNNING: 'RUNNING'>
    """

    model_config = ConfigDict(extra="forbid")

    job_id: str
    last_seq: int = 0
    state: JobState = JobState.QUEUED
    state_reason: str = ""
    attempt: int = 0
    num_restarts: int = 0
    step: int | None = None
    #: latest value of every metric name (any rank; rank 0 wins ties)
    latest: dict[str, float] = Field(default_factory=dict)
    #: name -> [(step, value)] from the lowest rank that reports, for charts
    series: dict[str, list[tuple[int, float]]] = Field(default_factory=dict)
    first_point_ts: float | None = None
    first_point_step: int | None = None
    last_point_ts: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    rank_exits: list[RankExit] = Field(default_factory=list)
    restarts_at_step: list[int] = Field(default_factory=list)
    log_tail: dict[int, list[str]] = Field(default_factory=dict)
    dropped_points: int = 0
    #: the failure of the latest failed attempt (also set while RESTARTING)
    failure: FailureInfo | None = None
    #: latest sample per "node/device"
    utilization: dict[str, DeviceSample] = Field(default_factory=dict)
    #: committed checkpoints, oldest first (event data: step, path, size, seconds ...)
    checkpoints: list[dict[str, Any]] = Field(default_factory=list)
    #: checkpoints restore passed over (files not matching their manifest), with why
    skipped_checkpoints: list[dict[str, Any]] = Field(default_factory=list)
    #: the step the current attempt resumed from (None: it started from scratch)
    resumed_from_step: int | None = None

    @classmethod
    def fold(cls, job_id: str, events: list[Event]) -> JobSnapshot:
        snap = cls(job_id=job_id)
        for e in events:
            snap.apply(e)
        return snap

    @property
    def steps_per_second(self) -> float | None:
        if (
            self.step is None
            or self.first_point_ts is None
            or self.last_point_ts is None
            or self.first_point_step is None
            or self.last_point_ts <= self.first_point_ts
        ):
            return None
        return (self.step - self.first_point_step) / (self.last_point_ts - self.first_point_ts)

    def apply(self, e: Event) -> None:
        if e.seq <= self.last_seq:
            return  # already folded (a reader may see an event twice across reconnects)
        self.last_seq = e.seq
        handler = _HANDLERS.get(e.type)
        if handler is not None:
            handler(self, e)

    def _on_state(self, e: Event) -> None:
        self.state = JobState(e.data["state"])
        self.state_reason = e.data.get("reason", "")
        if e.data.get("failure"):
            self.failure = FailureInfo.model_validate(e.data["failure"])
        if self.state is JobState.RUNNING and self.started_at is None:
            self.started_at = e.ts
        if self.state is JobState.RESTARTING:
            self.num_restarts += 1
            if self.step is not None:
                self.restarts_at_step.append(self.step)
        if self.state.terminal:
            self.ended_at = e.ts

    def _on_attempt(self, e: Event) -> None:
        if e.data.get("phase") == "started":
            self.attempt = int(e.data["attempt"])
            self.rank_exits = []
            self.resumed_from_step = None

    def _on_metrics(self, e: Event) -> None:
        rank = e.rank or 0
        for p in e.data.get("points", []):
            step, ts, values = int(p["step"]), float(p["ts"]), p["values"]
            if self.first_point_ts is None:
                self.first_point_ts, self.first_point_step = ts, step
            if self.step is None or step >= self.step:
                self.step = step
                self.last_point_ts = ts
            for name, value in values.items():
                if rank == 0 or name not in self.latest:
                    self.latest[name] = float(value)
                if rank == 0:
                    _append_point(self.series.setdefault(name, []), step, float(value))
        self.dropped_points += int(e.data.get("dropped_points", 0))

    def _on_log(self, e: Event) -> None:
        tail = deque(self.log_tail.get(e.rank or 0, []), maxlen=50)
        tail.extend(e.data.get("lines", []))
        self.log_tail[e.rank or 0] = list(tail)

    def _on_rank_exit(self, e: Event) -> None:
        self.rank_exits.append(RankExit.model_validate(e.data))

    def _on_util(self, e: Event) -> None:
        for raw in e.data.get("samples", []):
            sample = DeviceSample.model_validate(raw)
            self.utilization[f"{sample.node}/{sample.device}"] = sample

    def _on_checkpoint(self, e: Event) -> None:
        if "skipped" in e.data:
            self.skipped_checkpoints.append(dict(e.data))
        elif e.data.get("restored"):
            self.resumed_from_step = int(e.data["step"])
        else:
            self.checkpoints.append(dict(e.data))


def metric_order(name: str) -> tuple[int, str]:
    """How metric names are shown to people: "loss" first, then other training losses
    (Lightning's "train_loss", "train/loss"), then evaluation losses, then the rest.

    Example:
        >>> sorted(["epoch", "val_loss", "train_loss", "lr"], key=metric_order)
        ['train_loss', 'val_loss', 'epoch', 'lr']
    """
    if name == "loss":
        return 0, name
    if "loss" in name.lower():
        held_out = name.lower().startswith(("val", "eval", "test"))
        return (2 if held_out else 1), name
    return 3, name


def loss_name(names: Iterable[str]) -> str | None:
    """The loss a summary shows: the first of `names` by metric_order with "loss" in it.

    Example:
        >>> loss_name(["epoch", "train_loss"]), loss_name(["acc"])
        ('train_loss', None)
    """
    first = min(names, key=metric_order, default=None)
    return first if first is not None and "loss" in first.lower() else None


def _append_point(points: list[tuple[int, float]], step: int, value: float) -> None:
    points.append((step, value))
    if len(points) > MAX_SERIES_POINTS:
        # Keep the shape of a long run: drop every other point of the older half.
        half = len(points) // 2
        points[:half] = points[:half:2]


_HANDLERS: dict[EventType, Any] = {
    EventType.STATE: JobSnapshot._on_state,
    EventType.ATTEMPT: JobSnapshot._on_attempt,
    EventType.METRICS: JobSnapshot._on_metrics,
    EventType.LOG: JobSnapshot._on_log,
    EventType.RANK_EXIT: JobSnapshot._on_rank_exit,
    EventType.UTIL: JobSnapshot._on_util,
    EventType.CHECKPOINT: JobSnapshot._on_checkpoint,
}
