"""Where jobs wait within one cycle: each partition's line, and the memo of waits.

`PartitionCycle` is what a cycle learns of a partition (pool x accelerator) besides
its free capacity: its blocked head and that head's reservation, and its line of
waiting jobs with why each waits. `join_line` puts a job in a line.

The memo of waits is the fast path of a busy cycle. Once a (route, shape) is known
to fail in every partition of its route (each has a head, and a shape no larger
already failed there this cycle, alone or beside the reservation), every later job
of that route and shape fails too, since capacity only shrinks within a cycle:
`waits_as_before` puts it in line at the cost of one lookup. The memo holds until a
search fails anew (the walk then clears it), which may turn "reserved" into "does
not fit".

Example:
    >>> from air_sdk.scheduler.capacity import Capacity
    >>> from air_sdk.scheduler.gang import JobRequest, NodeSpec
    >>> st = PartitionCycle(Capacity([NodeSpec("n0", 8, tuple(range(8)))]).partitions[0], size=8)
    >>> join_line(st, JobRequest("j", 1, 4, 4), Reason.NO_FIT)
    >>> [j.job_id for j in st.waiting], st.demand_ahead
    (['j'], 4.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import islice

from air_sdk.scheduler.capacity import Alloc, Partition
from air_sdk.scheduler.explain import Reason
from air_sdk.scheduler.gang import JobRequest

__all__ = [
    "PartitionCycle",
    "Wait",
    "WaitMemo",
    "join_line",
    "wait_in",
    "waits_as_before",
    "where_it_fails",
]

_INF = math.inf
# an Enum member read through its class costs a metaclass lookup
_NO_FIT = Reason.NO_FIT
_RESERVED = Reason.RESERVED


@dataclass
class PartitionCycle:
    """What one cycle learns of a partition besides its free capacity."""

    part: Partition
    head: JobRequest | None = None
    res_start: float | None = None
    #: reserved node -> [slots, GPUs] it has to spare when the reservation starts
    res_spare: dict[int, list[int]] | None = None
    res_nodes: tuple[int, ...] = ()
    #: the jobs in line here, in order (position = index + 1), and why each waits
    waiting: list[JobRequest] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)
    demand_ahead: float = 0.0
    #: the partition's size in the unit demand is counted in (GPUs, or slots on CPU)
    size: float = 1.0
    #: this cycle's starts: (expected end, -start, allocations)
    started: list[tuple[float, float, tuple[Alloc, ...]]] = field(default_factory=list)
    waiting_for: tuple[str, ...] = ()


#: a partition where a job waits, why, and the end time before which it must still be
#: tried there (it would end before the head needs the room); -inf: never
Wait = tuple[PartitionCycle, Reason, float]
#: route key (which holds the shape) -> where such a job is known to wait this cycle
WaitMemo = dict[str, tuple[Wait, ...]]


def join_line(st: PartitionCycle, job: JobRequest, reason: Reason) -> None:
    """Put `job` at the end of `st`'s line. Positions, routes and sentences are made
    from the lines once the walk ends."""
    st.waiting.append(job)
    st.reasons.append(reason)
    st.demand_ahead += job.num_gpus if st.part.has_gpus else job.num_slots


def waits_as_before(
    memo: WaitMemo, route: list[PartitionCycle], job: JobRequest, now: float
) -> bool:
    """The fast path, the common case in a busy pool: if every partition the job may
    use has a head, and a shape no larger than the job's already failed in each this
    cycle (alone, or beside the head's reservation), the job fails too: it waits where
    the least demand is ahead, relative to the partition's size. False if it has to be
    tried. What is found is kept in `memo` for the next job of the route and shape."""
    waits = memo.get(job.route_key)  # the key holds the shape
    if waits is None:
        waits = where_it_fails(route, job.shape)
        if waits is None:
            return False
        memo[job.route_key] = waits
    est = job.est_duration_s
    return wait_in(waits, job, _INF if est is None else now + est)


def wait_in(waits: tuple[Wait, ...], job: JobRequest, end: float) -> bool:
    """Put `job` in line where it is known to wait, in the partition with the least
    demand ahead relative to its size (as `join_line` would, without one more call per
    job); False if the job, ending at `end`, must be tried."""
    st, reason, before = waits[0]
    if end <= before:
        return False  # it would end before the head needs the room: try it
    if len(waits) > 1:
        least = st.demand_ahead / st.size
        for other, why, before in islice(waits, 1, None):
            if end <= before:
                return False
            load = other.demand_ahead / other.size
            if load < least or (load == least and other.part.label < st.part.label):
                st, reason, least = other, why, load
    st.waiting.append(job)
    st.reasons.append(reason)
    st.demand_ahead += job.num_gpus if st.part.has_gpus else job.num_slots
    return True


def where_it_fails(
    route: list[PartitionCycle], shape: tuple[int, int, int]
) -> tuple[Wait, ...] | None:
    """Per partition of the route, why a job of `shape` waits there and the end
    time before which it must still be tried (-inf: never); None if it may fit in
    one of them."""
    n, s, g = shape
    found = []
    for st in route:
        if st.head is None:
            return None
        for fn, fs, fg in st.part.failed_plain:
            if fn <= n and fs <= s and fg <= g:
                found.append((st, _NO_FIT, -_INF))
                break
        else:
            for fn, fs, fg in st.part.failed_capped:
                if fn <= n and fs <= s and fg <= g:
                    before = -_INF if st.res_start is None else st.res_start
                    found.append((st, _RESERVED, before))
                    break
            else:
                return None
    return tuple(found)
