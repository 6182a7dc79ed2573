"""Job traces: the record the simulator replays, and a generator calibrated to the
published statistics of the Microsoft Philly trace (job sizes, run times) with the
accelerator mix of the Alibaba PAI 2020 cluster. Sources and numbers are cited in
docs/scheduling.md ("Trace generator"); `PHILLY` holds them.

Stdlib only (random, math): the scheduler package must not need numpy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from air_sdk.scheduler.gang import PRIORITIES

DAY_S = 86_400.0


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: when it arrives, its gang shape, how long it really runs.

    `est_duration` is what the scheduler is told (a user estimate or time limit);
    None when unknown. `duration` is the truth the simulator runs it for.

    Example:
        >>> TraceJob("j", arrival=0.0, nodes=2, gpus_per_node=8, duration=3600.0).num_gpus
        16
    """

    job_id: str
    arrival: float
    nodes: int
    gpus_per_node: int
    duration: float
    tenant: str = "default"
    priority: str = "normal"
    est_duration: float | None = None
    slots_per_node: int | None = None
    pool: str = "default"
    accelerator: str | None = None

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(f"job {self.job_id}: priority {self.priority!r} is not a class")
        if self.nodes < 1 or self.gpus_per_node < 0 or self.duration < 0:
            raise ValueError(
                f"job {self.job_id}: nodes={self.nodes} gpus_per_node={self.gpus_per_node}"
                f" duration={self.duration}: need nodes >= 1, gpus >= 0, duration >= 0"
            )

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def slots(self) -> int:
        """Rank slots per node: one rank per GPU, or the given value (1 on CPU)."""
        if self.slots_per_node is not None:
            return self.slots_per_node
        return self.gpus_per_node or 1


def gang_shape(total_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for a job of `total_gpus` on nodes of `gpus_per_node`:
    one node when it fits, else whole nodes (AIR gangs are N nodes x P ranks).

    Example:
        >>> gang_shape(4, 8), gang_shape(16, 8), gang_shape(12, 8)
        ((1, 4), (2, 8), (2, 6))
    """
    if total_gpus <= gpus_per_node:
        return 1, max(total_gpus, 0)
    nodes = math.ceil(total_gpus / gpus_per_node)
    return nodes, math.ceil(total_gpus / nodes)


@dataclass(frozen=True, kw_only=True)
class TraceProfile:
    """The statistics a synthetic trace is drawn from (see docs/scheduling.md)."""

    #: (total GPUs, probability): Philly job sizes as Gavel samples them (1: 70%,
    #: 2: 10%, 4: 15%, 8: 5%), with 1 point of the 8-GPU share moved to 16-64 GPU
    #: multi-node gangs ("few very large ones")
    gpu_demand: tuple[tuple[int, float], ...] = (
        (1, 0.70),
        (2, 0.10),
        (4, 0.15),
        (8, 0.04),
        (16, 0.006),
        (32, 0.003),
        (64, 0.001),
    )
    #: lognormal run time: the median and p80 of Gavel's Philly sampler (80% of jobs
    #: 10^U(1.5,3) min, 20% 10^U(3,4) min): median 274 min, p80 1000 min -> sigma 1.54
    duration_median_s: float = 274 * 60.0
    duration_sigma: float = 1.54
    duration_min_s: float = 60.0
    #: 10^4 minutes (6.9 days), the longest run time of the Philly sampler
    duration_max_s: float = 10_000 * 60.0
    #: arrival rate multiplier 1 + a*cos(2 pi (hour - peak)/24); a=0.5 is a 3:1 day/night swing
    diurnal_amplitude: float = 0.5
    peak_hour: float = 14.0
    #: share of jobs per priority class (an assumption: the public traces carry none)
    priority_mix: tuple[tuple[str, float], ...] = (("low", 0.2), ("normal", 0.7), ("high", 0.1))
    #: tenants and the Zipf exponent of their job counts (tenant k gets weight 1/k^skew)
    num_tenants: int = 4
    tenant_skew: float = 1.0
    gpus_per_node: int = 8
    #: accelerator types and their share of jobs; empty: no accelerator named
    accelerator_mix: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for name, dist in (("gpu_demand", self.gpu_demand), ("priority_mix", self.priority_mix)):
            total = sum(p for _, p in dist)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"{name} probabilities sum to {total}, not 1")
        if not 0 <= self.diurnal_amplitude < 1:
            raise ValueError("diurnal_amplitude must be in [0, 1)")


PHILLY = TraceProfile()

#: Alibaba PAI 2020: 6,742 GPUs on 1,897 machines; GPU types MISC 2,240, P100 1,596,
#: V100M32 1,080, T4 994, V100 832 (see docs/scheduling.md)
PAI_ACCELERATORS: tuple[tuple[str, float], ...] = (
    ("misc", 2240 / 6742),
    ("p100", 1596 / 6742),
    ("v100m32", 1080 / 6742),
    ("t4", 994 / 6742),
    ("v100", 832 / 6742),
)

Estimates = Literal["exact", "over", "none", "mixed"]


def _choice(rng: random.Random, dist: Sequence[tuple[object, float]]) -> object:
    r = rng.random()
    acc = 0.0
    for value, p in dist:
        acc += p
        if r < acc:
            return value
    return dist[-1][0]


def generate_trace(
    num_jobs: int,
    *,
    cluster_gpus: int,
    load: float = 0.9,
    profile: TraceProfile = PHILLY,
    seed: int = 0,
    estimates: Estimates = "exact",
) -> list[TraceJob]:
    """`num_jobs` jobs whose offered load is `load` x `cluster_gpus` (GPU-seconds
    asked per second), arriving as a Poisson process with a diurnal rate.

    `estimates`: "exact" (the scheduler is told the true run time), "over" (a time
    limit 1-3x the run time, as users set them), "none", or "mixed" (half none,
    half over).

    Example:
        >>> jobs = generate_trace(200, cluster_gpus=64, seed=1)
        >>> len(jobs), jobs[0].arrival <= jobs[-1].arrival
        (200, True)
    """
    if num_jobs < 1 or cluster_gpus < 1 or not load > 0:
        raise ValueError("need num_jobs >= 1, cluster_gpus >= 1 and load > 0")
    rng = random.Random(seed)
    tenants = [f"t{k}" for k in range(profile.num_tenants)]
    tenant_w = [1 / (k + 1) ** profile.tenant_skew for k in range(profile.num_tenants)]
    tenant_dist = [(t, w / sum(tenant_w)) for t, w in zip(tenants, tenant_w, strict=True)]
    mu = math.log(profile.duration_median_s)
    shapes: list[tuple[int, float, str, str, str | None]] = []
    for _ in range(num_jobs):
        gpus = int(_choice(rng, profile.gpu_demand))  # type: ignore[call-overload]
        dur = rng.lognormvariate(mu, profile.duration_sigma)
        dur = min(max(dur, profile.duration_min_s), profile.duration_max_s)
        tenant = str(_choice(rng, tenant_dist))
        prio = str(_choice(rng, profile.priority_mix))
        acc = str(_choice(rng, profile.accelerator_mix)) if profile.accelerator_mix else None
        shapes.append((gpus, dur, tenant, prio, acc))
    mean_work = sum(g * d for g, d, *_ in shapes) / num_jobs
    base_rate = load * cluster_gpus / mean_work  # jobs per second, averaged over a day
    arrivals = _diurnal_arrivals(rng, num_jobs, base_rate, profile)
    jobs = []
    for k, ((gpus, dur, tenant, prio, acc), t) in enumerate(zip(shapes, arrivals, strict=True)):
        nodes, per_node = gang_shape(gpus, profile.gpus_per_node)
        est: float | None = dur
        mode = estimates
        if mode == "mixed":
            mode = "none" if rng.random() < 0.5 else "over"
        if mode == "over":
            est = dur * rng.uniform(1.0, 3.0)
        elif mode == "none":
            est = None
        jobs.append(
            TraceJob(
                job_id=f"job-{k:06d}",
                arrival=t,
                nodes=nodes,
                gpus_per_node=per_node,
                duration=dur,
                tenant=tenant,
                priority=prio,
                est_duration=est,
                accelerator=acc,
            )
        )
    return jobs


def _diurnal_arrivals(
    rng: random.Random, n: int, base_rate: float, profile: TraceProfile
) -> list[float]:
    """Arrival times of a Poisson process with rate base_rate * (1 + a cos(...)), by
    thinning a process of the peak rate."""
    a = profile.diurnal_amplitude
    peak = base_rate * (1 + a)
    phase = profile.peak_hour * 3600.0
    out: list[float] = []
    t = 0.0
    while len(out) < n:
        t += rng.expovariate(peak)
        rate = base_rate * (1 + a * math.cos(2 * math.pi * (t - phase) / DAY_S))
        if rng.random() * peak <= rate:
            out.append(t)
    return out


@dataclass(frozen=True)
class TraceStats:
    """Summary statistics, to check a trace against its profile."""

    num_jobs: int
    share_by_gpus: dict[int, float]
    duration_p50_s: float
    duration_p80_s: float
    duration_p99_s: float
    mean_interarrival_s: float
    #: arrivals in the 6 busiest hours of the day over the 6 quietest
    diurnal_peak_to_trough: float
    share_by_priority: dict[str, float] = field(default_factory=dict)
    share_by_tenant: dict[str, float] = field(default_factory=dict)


def trace_stats(jobs: Sequence[TraceJob]) -> TraceStats:
    """The statistics `generate_trace` is calibrated on, measured on `jobs`."""
    n = len(jobs)
    if n == 0:
        raise ValueError("an empty trace has no statistics")
    by_gpus: dict[int, int] = {}
    by_prio: dict[str, int] = {}
    by_tenant: dict[str, int] = {}
    hours = [0] * 24
    for j in jobs:
        by_gpus[j.num_gpus] = by_gpus.get(j.num_gpus, 0) + 1
        by_prio[j.priority] = by_prio.get(j.priority, 0) + 1
        by_tenant[j.tenant] = by_tenant.get(j.tenant, 0) + 1
        hours[int((j.arrival % DAY_S) // 3600)] += 1
    durations = sorted(j.duration for j in jobs)
    arrivals = sorted(j.arrival for j in jobs)
    span = arrivals[-1] - arrivals[0]
    ordered_hours = sorted(hours)
    trough = sum(ordered_hours[:6])
    return TraceStats(
        num_jobs=n,
        share_by_gpus={g: c / n for g, c in sorted(by_gpus.items())},
        duration_p50_s=percentile(durations, 50),
        duration_p80_s=percentile(durations, 80),
        duration_p99_s=percentile(durations, 99),
        mean_interarrival_s=span / (n - 1) if n > 1 else 0.0,
        diurnal_peak_to_trough=sum(ordered_hours[-6:]) / trough if trough else math.inf,
        share_by_priority={p: c / n for p, c in sorted(by_prio.items())},
        share_by_tenant={t: c / n for t, c in sorted(by_tenant.items())},
    )


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values; nan if empty."""
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
