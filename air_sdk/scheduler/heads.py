"""A partition's blocked head job: its EASY reservation, or the preemption that makes
room for it.

The first job of a partition that does not fit becomes its head. A head whose
priority class may preempt gets the cheapest `PreemptionPlan` over the partitions
it may use (`plan_preemption`: fewest, lowest-priority, youngest victims; jobs
already stopping count as free). Any other head gets a reservation (`reserve`): the
earliest time enough running jobs will have ended, by their expected ends, for it
to fit, the nodes it will take then, and what those nodes have to spare, so that
jobs behind it may backfill without delaying it.

Example:
    >>> from air_sdk.scheduler.capacity import Capacity
    >>> from air_sdk.scheduler.gang import JobRequest, NodeSpec
    >>> from air_sdk.scheduler.state import ClusterBook
    >>> book = ClusterBook()
    >>> book.sync([NodeSpec("n0", 8, tuple(range(8)))], [])
    >>> st = PartitionCycle(book.capacity.partitions[0])
    >>> reserve(st, JobRequest("big", 1, 8, 8), book.capacity, book, now=5.0)
    >>> st.res_start, st.res_nodes
    (5.0, (0,))
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence

from air_sdk.scheduler.capacity import Alloc, Capacity
from air_sdk.scheduler.decision import Preemption
from air_sdk.scheduler.explain import need_text
from air_sdk.scheduler.gang import PRIORITY_RANK, JobRequest
from air_sdk.scheduler.preemption import PreemptionPlan, choose_victims
from air_sdk.scheduler.state import ClusterBook
from air_sdk.scheduler.waits import PartitionCycle

__all__ = ["plan_preemption", "preemptions_for", "reserve"]

_INF = math.inf


def _release_order(r: tuple[float, float, tuple[Alloc, ...]]) -> tuple[float, float]:
    return (r[0], r[1])


def plan_preemption(
    cap: Capacity,
    book: ClusterBook,
    routes: Sequence[PartitionCycle],
    job: JobRequest,
    now: float,
) -> tuple[PartitionCycle, PreemptionPlan, list[str]] | None:
    """The cheapest preemption that makes `job` fit in one of `routes`: (where, the
    plan, the jobs already stopping there); None if no set of victims does."""
    rank = PRIORITY_RANK[job.priority]
    best = None
    for cand in routes:
        p = cand.part
        terminating = book.terminating(p.index)
        plan = choose_victims(
            cap,
            p,
            job,
            [allocs for _, allocs in terminating],
            book.clearing_set,
            rank,
            now,
        )
        if plan is not None and (best is None or plan.cost() < best[0]):
            best = (plan.cost(), cand, plan, [j for j, _ in terminating])
    if best is None:
        return None
    _, st, plan, terminating_ids = best
    return st, plan, terminating_ids


def preemptions_for(job: JobRequest, st: PartitionCycle, plan: PreemptionPlan) -> list[Preemption]:
    """The `Preemption`s of `plan`'s victims, each saying for whom and why."""
    names = ", ".join(v.job_id for v in plan.victims)
    where = f"{need_text(job)} in pool {st.part.label!r}"
    reason = f"preempted for {job.priority}-priority job {job.job_id} ({where}); victims: {names}"
    return [
        Preemption(victim_job_id=v.job_id, for_job_id=job.job_id, reason=reason)
        for v in plan.victims
    ]


def _releases(
    st: PartitionCycle, book: ClusterBook, now: float
) -> Iterator[tuple[float, float, tuple[Alloc, ...]]]:
    """What running jobs and this cycle's starts free in `st`, earliest first."""
    mine = sorted(st.started, key=_release_order)
    return heapq.merge(book.releases(st.part.index, now), mine, key=_release_order)


def reserve(
    st: PartitionCycle, job: JobRequest, cap: Capacity, book: ClusterBook, now: float
) -> None:
    """EASY reservation: the earliest time enough running jobs will have ended (by
    their expected ends) for the head to fit, the nodes it would take then, and what
    those nodes have to spare for backfill; set on `st`."""
    n, s, g = job.nodes, job.slots_per_node, job.gpus_per_node
    free_then: dict[int, list[int]] = {}
    ready = {i for i in st.part.nodes if cap.free_slots[i] >= s and cap.free_gpus(i) >= g}
    start: float | None = now if len(ready) >= n else None
    if start is None:
        for end, _, allocs in _releases(st, book, now):
            for i, rs, rg in allocs:
                f = free_then.get(i)
                if f is None:
                    f = free_then[i] = [cap.free_slots[i], cap.free_gpus(i)]
                f[0] += rs
                f[1] += rg
                if f[0] >= s and f[1] >= g:
                    ready.add(i)
            if len(ready) >= n:
                start = end
                break
    st.res_start = None if start is None or start == _INF else start

    def free_at(i: int) -> list[int]:
        return free_then.get(i) or [cap.free_slots[i], cap.free_gpus(i)]

    # reserve the nodes busiest now: nodes free now stay open to long backfill jobs
    chosen = sorted(
        ready, key=lambda i: (cap.free_gpus(i), cap.free_slots[i], free_at(i)[1], cap.names[i])
    )[:n]
    st.res_nodes = tuple(chosen)
    st.res_spare = {i: [free_at(i)[0] - s, free_at(i)[1] - g] for i in chosen}
    if len(chosen) < n:
        # even every running job ending does not free enough (nodes gone unhealthy)
        st.res_start = None
