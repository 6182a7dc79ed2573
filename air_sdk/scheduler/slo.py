"""SLO arithmetic: samples over a rolling window -> value, error budget, burn rate. Pure
(no HTTP, SQL or clock): the runner reads the samples from the store
(`air_sdk.runner.slo_watch`), the cluster file declares the SLOs (`SloSpec`).

Every SLO is "this fraction of what happened was good" (the `objective`):

- a latency SLO ("p95 queue wait under 10 min"): each job start (or detected failure)
  is one event, bad when its seconds are over the target; the objective is the
  percentile (95 -> 0.95);
- goodput ("at least 0.9"): each second of a finished job's wall time is an event, bad
  when it was lost (restarts, redone work); the objective is the target itself.

Over the window: bad fraction = bad / total; the budget allows `1 - objective` of it;
burn rate = bad fraction / allowed (1: spending exactly as fast as allowed); budget
left = 1 - burn rate (negative: overspent). An SLO is burning once it has spent at
least `alert_burned` of its budget.

Example:
    >>> spec = SloSpec(name="wait", kind="queue_wait", target=600, objective=0.9)
    >>> samples = [latency_sample(f"j{i}", ts=i, seconds=60.0, target=600) for i in range(9)]
    >>> samples.append(latency_sample("slow", ts=9, seconds=900.0, target=600))
    >>> b = evaluate(spec, samples, now=10)
    >>> round(b.burn_rate, 6), round(b.budget_left, 6) + 0.0, b.burners
    (1.0, 0.0, [('slow', 1.0)])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from air_sdk.scheduler.explain import duration_text
from air_sdk.schema.slo import MAX_BURNERS, SloKind

__all__ = [
    "Budget",
    "Sample",
    "SloSpec",
    "evaluate",
    "goodput_sample",
    "latency_sample",
    "percentile",
    "queue_risk_text",
]


@dataclass(frozen=True, kw_only=True)
class SloSpec:
    """One SLO of a tenant, as the cluster file declares it.

    Example:
        >>> SloSpec(name="wait", kind="queue_wait", target=600, objective=0.95,
        ...         priority="high").describe()
        'p95 queue wait under 10 min (priority high)'
    """

    name: str
    kind: SloKind
    #: seconds (queue_wait, time_to_detect) or the least goodput (goodput)
    target: float
    #: the good fraction: the percentile for latencies, the target for goodput
    objective: float
    #: the rolling window the SLO is measured over
    window_s: float = 24 * 3600.0
    #: queue_wait only: count only jobs of this priority class (None: every job)
    priority: str | None = None
    #: the burned fraction of the budget at which the SLO is burning (an event, an alert)
    alert_burned: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.objective < 1:
            raise ValueError(
                f"SLO {self.name!r}: objective {self.objective} must be between 0 and 1"
                " (exclusive): e.g. percentile = 95, or at_least = 0.9"
            )
        if self.target <= 0:
            raise ValueError(f"SLO {self.name!r}: target {self.target} must be above 0")
        if self.window_s <= 0:
            raise ValueError(f"SLO {self.name!r}: window {self.window_s} s must be above 0")
        if not 0 < self.alert_burned <= 1:
            raise ValueError(
                f"SLO {self.name!r}: alert_burned {self.alert_burned} must be in (0, 1]:"
                " the fraction of the error budget spent when it alerts"
            )
        if self.priority is not None and self.kind != "queue_wait":
            raise ValueError(
                f"SLO {self.name!r}: priority applies to queue_wait SLOs only; remove it"
            )

    def describe(self) -> str:
        """The SLO in words, as `air slo` shows it."""
        if self.kind == "goodput":
            return f"goodput at least {self.target:g}"
        pct = f"p{self.objective * 100:g}"
        what = "queue wait" if self.kind == "queue_wait" else "time to detect a failure"
        text = f"{pct} {what} under {duration_text(self.target)}"
        return f"{text} (priority {self.priority})" if self.priority else text


@dataclass(frozen=True)
class Sample:
    """One thing that happened in the window: a job start, a detected failure, or a
    finished job's wall time. `total` counts it (1, or seconds), `bad` the part of it
    that missed the target."""

    job_id: str
    ts: float
    value: float
    total: float = 1.0
    bad: float = 0.0


def latency_sample(job_id: str, *, ts: float, seconds: float, target: float) -> Sample:
    """A job that waited (or whose failure went unnoticed for) `seconds`.

    Example:
        >>> latency_sample("j", ts=0, seconds=700, target=600).bad
        1.0
    """
    return Sample(job_id, ts, seconds, 1.0, 1.0 if seconds > target else 0.0)


def goodput_sample(job_id: str, *, ts: float, wall_s: float, productive_s: float) -> Sample:
    """A finished job: its lost seconds are the bad part of its wall time.

    Example:
        >>> goodput_sample("j", ts=0, wall_s=100, productive_s=80).bad
        20.0
    """
    productive = min(max(float(productive_s), 0.0), float(wall_s))
    return Sample(
        job_id, ts, productive / wall_s if wall_s > 0 else 1.0, wall_s, wall_s - productive
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-quantile (0 < q <= 1) of `values`; None for none.

    Example:
        >>> percentile([5, 1, 3, 2, 4], 0.95), percentile([5, 1, 3, 2, 4], 0.5), percentile([], 0.9)
        (5, 3, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Budget:
    """An SLO over its window, now."""

    #: the percentile (latency SLOs) or the goodput of the window; None with no samples
    value: float | None
    num_samples: int
    bad_fraction: float
    burn_rate: float
    budget_left: float
    burning: bool
    #: (job id, how much of the budget it burned), most first
    burners: list[tuple[str, float]] = field(default_factory=list)


def evaluate(spec: SloSpec, samples: Iterable[Sample], now: float) -> Budget:
    """`spec` over the samples in its window ending `now` (older ones, and any from the
    future, are left out).

    Example:
        >>> spec = SloSpec(name="g", kind="goodput", target=0.9, objective=0.9, window_s=100)
        >>> old = goodput_sample("old", ts=0, wall_s=100, productive_s=0)  # out of the window
        >>> new = goodput_sample("new", ts=150, wall_s=100, productive_s=95)
        >>> b = evaluate(spec, [old, new], now=200)
        >>> round(b.value, 2), round(b.burn_rate, 2), round(b.budget_left, 2), b.burning
        (0.95, 0.5, 0.5, True)
    """
    since = now - spec.window_s
    window = [s for s in samples if since <= s.ts <= now]
    total = sum(s.total for s in window)
    bad = sum(s.bad for s in window)
    if not window or total <= 0:
        return Budget(None, len(window), 0.0, 0.0, 1.0, False)
    bad_fraction = bad / total
    burn_rate = bad_fraction / (1 - spec.objective)
    budget_left = 1 - burn_rate
    if spec.kind == "goodput":
        value: float | None = 1 - bad_fraction
    else:
        value = percentile([s.value for s in window], spec.objective)
    per_job: dict[str, float] = {}
    for s in window:
        if s.bad > 0:
            per_job[s.job_id] = per_job.get(s.job_id, 0.0) + s.bad
    burners = sorted(per_job.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_BURNERS]
    # A float sum may land a hair under the threshold it reached exactly.
    burning = burn_rate >= spec.alert_burned - 1e-9
    return Budget(value, len(window), bad_fraction, burn_rate, budget_left, burning, burners)


def queue_risk_text(spec: SloSpec, budget: Budget, *, tenant: str, waited_s: float) -> str | None:
    """What a queued job's explanation adds when its tenant's queue-wait SLO is at risk
    (the SLO is burning, or this job has waited more than half the target); None when
    it is not.

    Example:
        >>> spec = SloSpec(name="wait", kind="queue_wait", target=600, objective=0.95)
        >>> ok = evaluate(spec, [], now=0)
        >>> queue_risk_text(spec, ok, tenant="acme", waited_s=60) is None
        True
        >>> queue_risk_text(spec, ok, tenant="acme", waited_s=400)
        "tenant acme's SLO 'wait' (p95 queue wait under 10 min) is at risk: this job has waited 6.7 min; 100% of its error budget left"
    """
    if spec.kind != "queue_wait" or (not budget.burning and waited_s <= spec.target / 2):
        return None
    left = max(budget.budget_left, 0.0)
    return (
        f"tenant {tenant}'s SLO {spec.name!r} ({spec.describe()}) is at risk: this job has"
        f" waited {_minutes(waited_s)}; {left:.0%} of its error budget left"
    )


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
