"""The platform's own metrics, in Prometheus' format (`GET /metrics`, docs/operations.md).

Two kinds, in one registry per gateway:

- instruments updated where things happen: a job leaves the queue (its wait), a job
  restarts (its failure kind), a job ends (its goodput), a worker report is ingested
  (its points, its checkpoints' blocking time, how long ingesting took: one
  observation per report, never per point), a scheduling cycle ends. State changes
  arrive through the store's transition listeners, cycles through the runner's
  `cycle_observers`;
- gauges read at scrape time (`StateCollector`): jobs by tenant and state, node
  health, the store's size, each SLO's budget.

Example:
    >>> from prometheus_client import generate_latest
    >>> m = GatewayMetrics()
    >>> m.observe_cycle(0.002)
    >>> b"air_scheduler_cycle_seconds_count 1.0" in generate_latest(m.registry)
    True
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from air_sdk.runner.slo_watch import ended_job_times
from air_sdk.schema import JobState

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from air_sdk.gateway.app import GatewayContext
    from air_sdk.store.jobs import Transition

log = logging.getLogger(__name__)

__all__ = ["GatewayMetrics", "StateCollector"]

_MINUTE, _HOUR = 60.0, 3600.0
#: queue waits: a second to a day
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, _HOUR, 4 * _HOUR, 12 * _HOUR, 24 * _HOUR)
GOODPUT_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
#: checkpoint blocking: DCP async saves block 0.02-0.11 s here, torch.save 0.16-0.41 s
BLOCKED_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, _MINUTE)
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
INGEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class GatewayMetrics:
    """The instruments of one gateway, in their own registry (two gateways in one
    process, as tests make, never share counts)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.queue_wait = Histogram(
            "air_queue_wait_seconds",
            "Time a job waited in the queue before it was placed (each start of a job).",
            ["tenant", "pool", "priority"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.restarts = Counter(
            "air_job_restarts",
            "Restarts of jobs, by the kind of failure (crash, oom, hang, lost_node, ...).",
            ["tenant", "reason"],
            registry=r,
        )
        self.finished = Counter(
            "air_jobs_finished", "Jobs that ended, by final state.", ["tenant", "state"], registry=r
        )
        self.goodput = Histogram(
            "air_job_goodput_ratio",
            "Goodput (productive / wall time) of each job that ended after running.",
            ["tenant"],
            buckets=GOODPUT_BUCKETS,
            registry=r,
        )
        self.checkpoint_blocked = Histogram(
            "air_checkpoint_blocked_seconds",
            "Seconds a training loop waited in checkpoint save(), per committed checkpoint.",
            buckets=BLOCKED_BUCKETS,
            registry=r,
        )
        self.cycle = Histogram(
            "air_scheduler_cycle_seconds",
            "Seconds of one scheduling cycle.",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.points = Counter(
            "air_ingest_points", "Metric points ingested from worker reports.", registry=r
        )
        self.reports = Counter(
            "air_ingest_reports",
            "Worker reports ingested, by body format (json: a runtime older than msgpack"
            " reports, curl, a function's result).",
            ["format"],
            registry=r,
        )
        self._reports_by_format: dict[str, Any] = {}
        self.ingest = Histogram(
            "air_ingest_report_seconds",
            "Seconds the gateway took to check, scrub and store one worker report.",
            buckets=INGEST_BUCKETS,
            registry=r,
        )

    def attach(self, ctx: GatewayContext) -> None:
        """Listen to `ctx`'s store and runner, and read its state at scrape time."""
        ctx.store.add_transition_listener(lambda change: self.on_transition(ctx, change))
        ctx.runner.cycle_observers.append(self.observe_cycle)
        self.registry.register(StateCollector(ctx))

    def observe_cycle(self, seconds: float) -> None:
        self.cycle.observe(seconds)

    def observe_report(
        self,
        *,
        num_points: int,
        blocked_s: Iterable[float],
        seconds: float,
        body_format: str = "json",
    ) -> None:
        """One ingested report: its points counted in one step, its checkpoints' waits,
        its body's format (`json` or `msgpack`)."""
        counter = self._reports_by_format.get(body_format)
        if counter is None:  # looked up once per format: labels() is a dict build and a lock
            counter = self._reports_by_format[body_format] = self.reports.labels(format=body_format)
        counter.inc()
        if num_points:
            self.points.inc(num_points)
        for blocked in blocked_s:
            self.checkpoint_blocked.observe(blocked)
        self.ingest.observe(seconds)

    def on_transition(self, ctx: GatewayContext, change: Transition) -> None:
        """A store transition listener: a start, a restart or an end of a job."""
        job = change.job
        if job.state is JobState.SCHEDULED and change.previous is JobState.QUEUED:
            wait = max(0.0, job.updated_at - change.previous_since)
            self.queue_wait.labels(job.tenant, job.spec.pool, job.spec.priority).observe(wait)
        elif job.state is JobState.RESTARTING:
            reason = job.failure.kind if job.failure is not None else "unknown"
            self.restarts.labels(job.tenant, reason).inc()
        elif job.state.terminal:
            self.finished.labels(job.tenant, job.state.value).inc()
            times = ended_job_times(ctx.store, job)
            if times is not None:
                wall_s, productive_s = times
                self.goodput.labels(job.tenant).observe(min(1.0, productive_s / wall_s))


class StateCollector(Collector):
    """Gauges read from the store and the runner at each scrape."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time: nothing to describe ahead

    def collect(self) -> Iterator[Metric]:
        import time

        from air_sdk.gateway.admin import node_health

        ctx = self.ctx
        jobs = GaugeMetricFamily(
            "air_jobs", "Jobs by tenant and state, now.", labels=["tenant", "state"]
        )
        counts = ctx.store.jobs_by_state()
        tenants = sorted({t for t, _ in counts})
        for tenant in tenants:
            for state in JobState:  # every state, 0 included, so a rule sees a series
                jobs.add_metric([tenant, state.value], counts.get((tenant, state.value), 0))
        yield jobs
        healthy = GaugeMetricFamily(
            "air_node_healthy",
            "1 while a node takes placements, 0 while kept out.",
            labels=["node"],
        )
        failures = GaugeMetricFamily(
            "air_node_failures", "Failures recorded against a node.", labels=["node"]
        )
        for name, node in node_health(ctx).items():
            healthy.add_metric([name], 1 if node.healthy else 0)
            failures.add_metric([name], node.num_failures)
        yield healthy
        yield failures
        yield GaugeMetricFamily(
            "air_store_size_bytes",
            "Bytes of the control-plane database on disk (its write-ahead log included).",
            value=ctx.store.store_size_bytes(),
        )
        yield from _slo_gauges(ctx, time.time())


def _slo_gauges(ctx: GatewayContext, now: float) -> Iterator[Metric]:
    labels = ["tenant", "slo", "kind"]
    left = GaugeMetricFamily(
        "air_slo_budget_left_ratio",
        "Error budget left over the SLO's window (1 all of it, below 0 overspent).",
        labels=labels,
    )
    rate = GaugeMetricFamily(
        "air_slo_burn_rate", "How fast the window spends the budget (1: as allowed).", labels=labels
    )
    burning = GaugeMetricFamily(
        "air_slo_burning",
        "1 once the SLO spent its alert_burned share of its budget.",
        labels=labels,
    )
    value = GaugeMetricFamily(
        "air_slo_value", "The SLO's percentile (seconds) or goodput now.", labels=labels
    )
    for s in ctx.runner.slo_watch.statuses(None, now):
        key = [s.tenant, s.name, s.kind]
        left.add_metric(key, s.budget_left)
        rate.add_metric(key, s.burn_rate)
        burning.add_metric(key, 1 if s.burning else 0)
        if s.value is not None:
            value.add_metric(key, s.value)
    yield from (left, rate, burning, value)
