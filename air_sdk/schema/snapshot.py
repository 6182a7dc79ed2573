"""JobSnapshot: the fold of a job's event log into what a person looks at.

Readers (CLI progress, the notebook monitor) keep one snapshot and `apply` each
new event; a reconnecting reader continues from `snapshot.last_seq`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from air_sdk.schema.data import DataLoadingSummary, RankDataLoading
from air_sdk.schema.events import (
    Alert,
    AttemptChange,
    CheckpointCommit,
    CheckpointRestore,
    CheckpointSkip,
    DeviceSample,
    Event,
    ExportStatus,
    FailureInfo,
    LogBatch,
    MetricsBatch,
    RankExit,
    StateChange,
    UtilBatch,
)
from air_sdk.schema.numbers import NON_FINITE
from air_sdk.schema.state import JobState

#: points kept per metric name for charts; older points are thinned, not dropped at random
MAX_SERIES_POINTS = 2000

#: series the worker runtime derives from `air.log(..., tokens=N)` (see
#: `air_sdk.runtime._throughput`): the job's tokens per second, rank 0's model FLOPs
#: utilization (0..1), and rank 0's FLOPs per step once counted; with counted FLOPs also
#: the hardware FLOPs utilization (recompute included) and hardware FLOPs per step
TOKENS_PER_S_METRIC = "tokens_per_s"
MFU_METRIC = "mfu"
FLOPS_PER_STEP_METRIC = "flops_per_step"
HFU_METRIC = "hfu"
HARDWARE_FLOPS_PER_STEP_METRIC = "hardware_flops_per_step"
#: the run's length, when a rank logs it: `air.log(step, total_steps=N)`
TOTAL_STEPS_METRIC = "total_steps"
#: derived values, shown as throughput rather than among the logged metrics
DERIVED_METRICS = frozenset(
    {
        TOKENS_PER_S_METRIC,
        MFU_METRIC,
        FLOPS_PER_STEP_METRIC,
        HFU_METRIC,
        HARDWARE_FLOPS_PER_STEP_METRIC,
    }
)


class JobSnapshot(BaseModel):
    """What is known about a job after folding its events up to `last_seq`.

    Example:
        >>> snap = JobSnapshot(job_id="j")
        >>> snap.apply(Event(seq=1, job_id="j", ts=1.0, type="state", data={"state": "RUNNING"}))
        >>> snap.state
        <JobState.RUNNING: 'RUNNING'>
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan=NON_FINITE)

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
    #: the first and latest points of `rate_rank`, the lowest rank that reported: the
    #: rate is measured on one rank's progress (ranks start and end apart; a rate from
    #: one rank's first point to another's last can be negative or missing)
    first_point_ts: float | None = None
    first_point_step: int | None = None
    last_point_ts: float | None = None
    last_point_step: int | None = None
    rate_rank: int | None = None
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
    #: committed checkpoints, oldest first
    checkpoints: list[CheckpointCommit] = Field(default_factory=list)
    #: checkpoints restore passed over (files not matching their manifest), with why
    skipped_checkpoints: list[CheckpointSkip] = Field(default_factory=list)
    #: the step the current attempt resumed from (None: it started from scratch)
    resumed_from_step: int | None = None
    #: tracker -> where the gateway exports the job and how it went (`JobSpec.export`)
    exports: dict[str, ExportStatus] = Field(default_factory=dict)
    #: rank -> its data-loading totals and rates in the current attempt (ranks that count)
    data_loading: dict[int, RankDataLoading] = Field(default_factory=dict)
    #: the run's length in steps: the spec's `total_steps` (a reader starts its fold
    #: with it: `Job.new_snapshot()`), replaced by one a rank logs (TOTAL_STEPS_METRIC)
    total_steps: int | None = None

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
        last_step = self.step if self.last_point_step is None else self.last_point_step
        return (last_step - self.first_point_step) / (self.last_point_ts - self.first_point_ts)

    @property
    def steps_done(self) -> int | None:
        """How many steps ran, from the latest step index: a loop whose first logged
        step is 0 counts from 0 (its step 149 is its 150th), one from 1 from 1.

        Example:
            >>> JobSnapshot(job_id="j", step=149, first_point_step=0).steps_done
            150
            >>> JobSnapshot(job_id="j", step=150, first_point_step=1).steps_done
            150
        """
        if self.step is None:
            return None
        return self.step + 1 if self.first_point_step == 0 else self.step

    @property
    def tokens_per_s(self) -> float | None:
        """The whole job's tokens per second at the latest point that had them (the
        runtime derives it from `air.log(..., tokens=N)`); its history is
        `series["tokens_per_s"]`.

        Example:
            >>> JobSnapshot(job_id="j", latest={"tokens_per_s": 5e4}).tokens_per_s
            50000.0
        """
        return self.latest.get(TOKENS_PER_S_METRIC)

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization (0..1) as rank 0 measures it; None without a known
        peak (a CPU) or FLOP count. Its history is `series["mfu"]`.

        Example:
            >>> JobSnapshot(job_id="j", latest={"mfu": 0.41}).mfu
            0.41
        """
        return self.latest.get(MFU_METRIC)

    @property
    def data_summary(self) -> DataLoadingSummary | None:
        """The job's samples/s, data-wait share, cache hit rate and the ranks waiting for
        data now; None when no rank counts data loading (`air.data.timed`).

        Example:
            >>> JobSnapshot(job_id="j").data_summary is None
            True
        """
        return DataLoadingSummary.of(self.data_loading)

    def apply(self, e: Event) -> None:
        """Fold one event (one already folded, by `seq`, is skipped).

        Example:
            >>> snap = JobSnapshot(job_id="j")
            >>> snap.apply(Event(seq=1, job_id="j", ts=0.0, type="log", rank=1, data={"lines": ["hi"]}))
            >>> snap.log_tail
            {1: ['hi']}
        """
        if e.seq <= self.last_seq:
            return  # already folded (a reader may see an event twice across reconnects)
        self.last_seq = e.seq
        match e.payload():
            case StateChange() as change:
                self._on_state(e.ts, change)
            case AttemptChange() as change:
                if change.phase == "started":
                    self.attempt = change.attempt
                    self.rank_exits = []
                    self.resumed_from_step = None
                    self.data_loading = {}
            case MetricsBatch() as batch:
                self._on_metrics(e.rank or 0, batch)
            case LogBatch() as batch:
                tail = deque(self.log_tail.get(e.rank or 0, []), maxlen=50)
                tail.extend(batch.lines)
                self.log_tail[e.rank or 0] = list(tail)
            case RankExit() as exit_:
                self.rank_exits.append(exit_)
            case UtilBatch() as batch:
                for sample in batch.samples:
                    self.utilization[f"{sample.node}/{sample.device}"] = sample
            case CheckpointCommit() as commit:
                self.checkpoints.append(commit.recorded_at(e.ts))
            case CheckpointSkip() as skip:
                self.skipped_checkpoints.append(skip)
            case CheckpointRestore() as restore:
                self.resumed_from_step = restore.step
            case ExportStatus() as export:
                self.exports[export.to] = export
            case Alert():
                pass  # shown by the readers that list alerts, not part of the fold

    def _on_state(self, ts: float, change: StateChange) -> None:
        self.state = change.state
        self.state_reason = change.reason
        if change.failure is not None:
            self.failure = change.failure
        if self.state is JobState.RUNNING and self.started_at is None:
            self.started_at = ts
        if self.state is JobState.RESTARTING:
            self.num_restarts += 1
            if self.step is not None:
                self.restarts_at_step.append(self.step)
        if self.state.terminal:
            self.ended_at = ts

    def _on_metrics(self, rank: int, batch: MetricsBatch) -> None:
        if batch.points and (self.rate_rank is None or rank < self.rate_rank):
            self.rate_rank = rank  # a lower rank's points replace a higher one's
            self.first_point_ts = self.last_point_ts = None
            self.first_point_step = self.last_point_step = None
        for p in batch.points:
            if rank == self.rate_rank:
                if self.first_point_ts is None:
                    self.first_point_ts, self.first_point_step = p.ts, p.step
                if self.last_point_step is None or p.step >= self.last_point_step:
                    self.last_point_ts, self.last_point_step = p.ts, p.step
            if self.step is None or p.step >= self.step:
                self.step = p.step
            total = p.values.get(TOTAL_STEPS_METRIC)
            if total is not None and math.isfinite(total) and total >= 1:
                self.total_steps = int(total)
            for name, value in p.values.items():
                if rank == 0 or name not in self.latest:
                    self.latest[name] = value
                if rank == 0:
                    _append_point(self.series.setdefault(name, []), p.step, value)
        self.dropped_points += batch.dropped_points
        if batch.data is not None:
            known = self.data_loading.get(rank)
            self.data_loading[rank] = (
                RankDataLoading.first(batch.data) if known is None else known.updated(batch.data)
            )


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
