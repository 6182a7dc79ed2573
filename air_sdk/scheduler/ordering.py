"""The order a cycle tries queued jobs in: priority class, then fair share, then
submit time.

A job that has waited `aging_s` counts one priority class higher (two after twice
as long), but never into a class that may preempt. Within a class, with
`fair_share="drf"`, a job's key is its tenant's dominant share (the larger of its
GPU and slot fractions of the cluster, divided by the tenant's weight) once the
tenant's earlier queued jobs have started: dominant-resource fairness by progressive
filling, evaluated once per cycle.

Example:
    >>> from air_sdk.scheduler.gang import JobRequest
    >>> from air_sdk.scheduler.policy import SchedulerPolicy
    >>> q = [JobRequest("a1", 1, 4, 4, tenant="a", submitted_at=1),
    ...      JobRequest("a2", 1, 4, 4, tenant="a", submitted_at=2),
    ...      JobRequest("b1", 1, 4, 4, tenant="b", submitted_at=3)]
    >>> order = order_queue(q, SchedulerPolicy(), 10.0, {}, {}, total_gpus=8, total_slots=8)
    >>> [j.job_id for j in order]
    ['a1', 'b1', 'a2']
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from itertools import islice

from air_sdk.scheduler.gang import PRIORITY_RANK, JobRequest
from air_sdk.scheduler.policy import SchedulerPolicy

__all__ = ["order_queue"]

_INF = math.inf
_submitted_at = operator.attrgetter("submitted_at")


def order_queue(
    queue: Sequence[JobRequest],
    policy: SchedulerPolicy,
    now: float,
    used_gpus: Mapping[str, int],
    used_slots: Mapping[str, int],
    *,
    total_gpus: int,
    total_slots: int,
) -> list[JobRequest]:
    """`queue` in the order the cycle tries it. `used_gpus` / `used_slots`: what each
    tenant's running jobs hold; `total_*`: the cluster's healthy capacity."""
    jobs = list(queue)
    # the runner passes the queue oldest first: then this is one pass (in C), not a sort
    times = list(map(_submitted_at, jobs))
    if any(map(operator.lt, islice(times, 1, None), times)):
        jobs.sort(key=_submitted_at)  # stable: ties keep the given order
    rank = PRIORITY_RANK
    aging = policy.aging_s

    # a job that has waited `aging` is ordered one class higher (two after 2x), but
    # never into a class that may preempt: else a preempted job would come back ahead
    # of the job that preempted it, and the two would take turns forever
    aged_before = -_INF if aging is None else now - aging
    top = 2
    if policy.preemption and policy.preemptor_priorities:
        top = min(rank[p] for p in policy.preemptor_priorities) - 1

    def klass(job: JobRequest) -> int:
        r = rank[job.priority]
        if job.submitted_at <= aged_before and r < top and aging is not None:
            r = min(top, r + int((now - job.submitted_at) // aging))
        return r

    if policy.fair_share == "fifo":
        return sorted(jobs, key=lambda j: -klass(j))
    tg = float(total_gpus) or _INF
    ts = float(total_slots) or _INF
    weights = policy.weights
    share: dict[str, float] = {}
    keys: list[float] = []  # the tenant's dominant share before the job
    classes: list[int] = []  # minus the class it is ordered in
    for job in jobs:
        t = job.tenant
        s = share.get(t)
        if s is None:
            g0, s0 = used_gpus.get(t, 0) / tg, used_slots.get(t, 0) / ts
            s = (g0 if g0 > s0 else s0) / weights.get(t, 1.0)
        r = rank[job.priority]
        if job.submitted_at <= aged_before and r < top:
            r = klass(job)
        keys.append(s)
        classes.append(-r)
        dg, ds = job.num_gpus / tg, job.num_slots / ts
        share[t] = s + (dg if dg > ds else ds) / weights.get(t, 1.0)
    # by (class, share, position): two stable sorts on plain numbers, which allocate
    # no tuple per job (fewer garbage-collector passes)
    index = sorted(range(len(jobs)), key=keys.__getitem__)
    index.sort(key=classes.__getitem__)
    return [jobs[i] for i in index]
