"""What the scheduler remembers between cycles: the free capacity after the running
jobs, each tenant's usage, and per partition the running jobs ordered by expected
end. Kept up to date from the (inventory, running) the caller passes each cycle, by
difference: a cycle costs O(changes + nodes), not O(running jobs).

Pass the same `RunningJob` objects from cycle to cycle where you can, in a stable
order (a dict's values: ended jobs drop out, new ones come last): the difference is
then found by walking this cycle's list and the last one in step, comparing objects
by identity, in C; only where they differ is Python code run.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress, count, islice

from air_sdk.scheduler.capacity import Alloc, Capacity
from air_sdk.scheduler.gang import PRIORITY_RANK, NodeSpec
from air_sdk.scheduler.preemption import (
    Clearing,
    OnNode,
    VictimCandidate,
    clearing_set,
    victim_order,
)
from air_sdk.schema import Placement

_INF = math.inf


@dataclass(frozen=True)
class RunningJob:
    """A job that holds a placement now.

    `est_end` is when it is expected to end (start + estimate or time limit); None if
    unknown. `terminating` marks a job whose stop (preemption, cancel) is in flight:
    its resources are about to be free, so it is not preempted again.

    Example:
        >>> from air_sdk.schema import NodeAssignment, Placement
        >>> p = Placement(job_id="a", nodes=(NodeAssignment(node="n0", slots=2, gpus=(0, 1)),))
        >>> RunningJob(p, tenant="t", priority="low", started_at=0.0).num_gpus
        2
    """

    placement: Placement
    tenant: str = "default"
    priority: str = "normal"
    started_at: float = 0.0
    est_end: float | None = None
    preemptible: bool = True
    terminating: bool = False

    @property
    def job_id(self) -> str:
        return self.placement.job_id

    @cached_property
    def num_gpus(self) -> int:
        return sum(len(a.gpus) for a in self.placement.nodes)

    @cached_property
    def num_slots(self) -> int:
        return sum(a.slots for a in self.placement.nodes)


def _same(a: RunningJob, b: RunningJob) -> bool:
    if a is b:
        return True
    return (
        (a.placement is b.placement or a.placement == b.placement)
        and a.tenant == b.tenant
        and a.priority == b.priority
        and a.started_at == b.started_at
        and a.est_end == b.est_end
        and a.preemptible == b.preemptible
        and a.terminating == b.terminating
    )


@dataclass(slots=True)
class _Held:
    job: RunningJob
    allocs: tuple[Alloc, ...]
    part: int | None
    end: float
    victim: VictimCandidate | None


@dataclass
class _PartitionJobs:
    #: (expected end, -start, job id) of non-terminating jobs, sorted: known ends first,
    #: then jobs without one, youngest first (with heavy-tailed run times, a job that
    #: has run longer is likely to run longer still)
    ends: list[tuple[float, float, str]] = field(default_factory=list)
    terminating: dict[str, None] = field(default_factory=dict)


class ClusterBook:
    """Capacity and usage after the running jobs, updated by difference each cycle."""

    def __init__(self) -> None:
        self._inventory: list[NodeSpec] = []
        self.capacity = Capacity([])
        self.held: dict[str, _Held] = {}
        self.parts: list[_PartitionJobs] = []
        #: per node: the preemptible jobs holding a part of it, with their share of it
        self.node_victims: list[dict[str, OnNode]] = []
        #: per node: node_victims in victim order, made when first asked for
        self._node_order: list[list[OnNode] | None] = []
        #: per node: its clearing sets asked for since its jobs last changed
        self._clearing: list[dict[tuple[int, int, int, int, int], Clearing | None] | None] = []
        #: per node: [slots, GPUs] its preemptible jobs hold, per priority rank
        self._victim_hold: list[list[list[int]]] = []
        self.used_gpus: dict[str, int] = {}
        self.used_slots: dict[str, int] = {}
        #: the running jobs of the last sync, as passed
        self._running: list[RunningJob] = []

    def sync(self, inventory: Sequence[NodeSpec], running: Sequence[RunningJob]) -> None:
        inv = list(inventory)
        cur = list(running)
        if inv != self._inventory:  # node by node, identity first (in C)
            self._rebuild(inv, cur)
            return
        changes = _changes_in_step(self._running, cur)
        if changes is None:  # the order changed: compare all by identity
            changes = _changes_by_identity(self._running, cur)
        gone, new = changes
        if gone or new:
            self._apply(gone, new)
            if len(self.held) != len(cur):
                self._rebuild(inv, cur)  # a job listed twice: fail as decide() does
                return
        self._running = cur

    def _apply(self, gone: list[RunningJob], new: list[RunningJob]) -> None:
        """Jobs whose objects left the list and objects that joined it; by job id, an
        equal new object for a job changes nothing."""
        held = self.held
        arrived = {r.job_id: r for r in new}
        for r in gone:
            job_id = r.job_id
            h = held.get(job_id)
            if h is None:
                continue
            replacement = arrived.get(job_id)
            if replacement is not None and _same(h.job, replacement):
                h.job = replacement
                del arrived[job_id]
                continue
            self._remove(job_id)
        for job_id, r in arrived.items():
            if job_id in held:
                self._remove(job_id)
            self._add(r)

    def _rebuild(self, inventory: list[NodeSpec], running: Sequence[RunningJob]) -> None:
        self._inventory = inventory
        self.capacity = Capacity(inventory)
        self.held = {}
        self.parts = [_PartitionJobs() for _ in self.capacity.partitions]
        self.node_victims = [{} for _ in self.capacity.names]
        self._node_order = [None] * len(self.capacity.names)
        self._clearing = [None] * len(self.capacity.names)
        self._victim_hold = [[[0, 0] for _ in PRIORITY_RANK] for _ in self.capacity.names]
        self.used_gpus = {}
        self.used_slots = {}
        for r in running:
            if r.job_id in self.held:
                raise ValueError(f"running job {r.job_id!r} appears twice")
            self._add(r)
        self._running = list(running)

    def _add(self, r: RunningJob) -> None:
        cap = self.capacity
        allocs = tuple(cap.allocs_of(r.placement))
        cap.take(r.placement)
        part = cap.part_index[allocs[0][0]] if allocs else None
        end = _INF if r.est_end is None else r.est_end
        victim = None
        if r.preemptible and not r.terminating and allocs:
            victim = VictimCandidate(
                r.job_id, PRIORITY_RANK.get(r.priority, 1), r.started_at, allocs
            )
        h = _Held(r, allocs, part, end, victim)
        self.held[r.job_id] = h
        if victim is not None:
            for i, rs, rg in allocs:
                self.node_victims[i][r.job_id] = (victim, rs, rg)
                self._node_order[i] = None
                self._clearing[i] = None
                hold = self._victim_hold[i][victim.rank]
                hold[0] += rs
                hold[1] += rg
        t = r.tenant
        self.used_gpus[t] = self.used_gpus.get(t, 0) + r.num_gpus
        self.used_slots[t] = self.used_slots.get(t, 0) + r.num_slots
        if part is not None:
            pj = self.parts[part]
            if r.terminating:
                pj.terminating[r.job_id] = None
            else:
                insort(pj.ends, (end, -r.started_at, r.job_id))

    def _remove(self, job_id: str) -> None:
        h = self.held.pop(job_id)
        r = h.job
        self.capacity.give_back(r.placement)
        if h.victim is not None:
            for i, rs, rg in h.allocs:
                self.node_victims[i].pop(job_id, None)
                self._node_order[i] = None
                self._clearing[i] = None
                hold = self._victim_hold[i][h.victim.rank]
                hold[0] -= rs
                hold[1] -= rg
        t = r.tenant
        self.used_gpus[t] -= r.num_gpus
        self.used_slots[t] -= r.num_slots
        if h.part is not None:
            pj = self.parts[h.part]
            if r.terminating:
                del pj.terminating[job_id]
            else:
                del pj.ends[bisect_left(pj.ends, (h.end, -r.started_at, job_id))]

    # -- per-partition views for a cycle ------------------------------------------------------

    def releases(self, part: int, now: float) -> Iterator[tuple[float, float, tuple[Alloc, ...]]]:
        """(time, -start, allocations) as running jobs are expected to free them, earliest
        first (time inf: unknown, youngest first); terminating jobs free theirs now."""
        pj = self.parts[part]
        held = self.held
        for job_id in sorted(pj.terminating):
            yield now, -now, held[job_id].allocs
        for end, age_key, job_id in pj.ends:
            yield (end if end > now else now), age_key, held[job_id].allocs

    def victims_on(self, node: int) -> list[OnNode]:
        """The preemptible jobs on `node` in victim order (lowest priority, youngest)."""
        order = self._node_order[node]
        if order is None:
            order = self._node_order[node] = sorted(
                self.node_victims[node].values(), key=lambda e: victim_order(e[0])
            )
        return order

    def clearing_set(
        self, node: int, max_rank: int, fs: int, fg: int, s: int, g: int
    ) -> Clearing | None:
        """`preemption.clearing_set` of `node`'s victims, remembered until a job on the
        node changes: a blocked high-priority gang is priced on every node of every
        pool it may use, cycle after cycle, while few of those nodes change."""
        memo = self._clearing[node]
        if memo is None:
            memo = self._clearing[node] = {}
        key = (max_rank, fs, fg, s, g)
        if key in memo:
            return memo[key]
        # all its jobs of rank <= max_rank together may not free enough: then there is
        # no clearing set, and no need to sort them
        most_s, most_g = fs, fg
        for hs, hg in islice(self._victim_hold[node], max_rank + 1):
            most_s += hs
            most_g += hg
        if most_s < s or most_g < g:
            memo[key] = None
            return None
        found = memo[key] = clearing_set(self.victims_on(node), max_rank, fs, fg, s, g)
        return found

    def terminating(self, part: int) -> list[tuple[str, tuple[Alloc, ...]]]:
        pj = self.parts[part]
        return [(j, self.held[j].allocs) for j in sorted(pj.terminating)]


# -- the difference between two lists of running jobs ---------------------------------------

#: the identical objects compared per step in C when walking two lists
_CHUNK = 64
#: how many objects, of both lists together, may lie between two that still match up
_REALIGN = 16


def _changes_in_step(
    prev: list[RunningJob], cur: list[RunningJob]
) -> tuple[list[RunningJob], list[RunningJob]] | None:
    """(gone, new): the objects only in `prev`, and only in `cur`, by identity, found by
    walking both lists in step; None if they are too far out of step (reordered).

    Example:
        >>> from air_sdk.schema import Placement
        >>> a, b, c, d = (RunningJob(Placement(job_id=j, nodes=())) for j in "abcd")
        >>> gone, new = _changes_in_step([a, b, c], [a, c, d])
        >>> [r.job_id for r in gone], [r.job_id for r in new]
        (['b'], ['d'])
    """
    gone: list[RunningJob] = []
    new: list[RunningJob] = []
    i = j = 0
    while True:
        k = _common_run(prev, i, cur, j)
        i += k
        j += k
        if i == len(prev) or j == len(cur):
            break
        step = _realign(prev, i, cur, j)
        if step is None:
            return None
        a, b = step
        gone += prev[i : i + a]
        new += cur[j : j + b]
        i += a
        j += b
    gone += prev[i:]
    new += cur[j:]
    if gone and new:  # an object that moved is on both sides: it neither left nor came
        moved = {id(r) for r in gone}.intersection(map(id, new))
        if moved:
            gone = [r for r in gone if id(r) not in moved]
            new = [r for r in new if id(r) not in moved]
    return gone, new


def _common_run(prev: list[RunningJob], i: int, cur: list[RunningJob], j: int) -> int:
    """How many objects `prev[i:]` and `cur[j:]` have in common from their start."""
    start = i
    while i < len(prev) and j < len(cur):
        size = min(_CHUNK, len(prev) - i, len(cur) - j)
        differ = map(operator.is_not, prev[i : i + size], cur[j : j + size])
        k = next(compress(count(), differ), size)
        i += k
        j += k
        if k < size:
            break
    return i - start


def _realign(
    prev: list[RunningJob], i: int, cur: list[RunningJob], j: int
) -> tuple[int, int] | None:
    """The fewest objects to skip, (a of prev, b of cur), so that `prev[i + a]` is
    `cur[j + b]` or one list ends."""
    for d in range(1, _REALIGN + 1):
        for a in range(d, -1, -1):
            b = d - a
            if i + a == len(prev) or j + b == len(cur):
                return a, b
            if i + a < len(prev) and j + b < len(cur) and prev[i + a] is cur[j + b]:
                return a, b
    return None


def _changes_by_identity(
    prev: list[RunningJob], cur: list[RunningJob]
) -> tuple[list[RunningJob], list[RunningJob]]:
    before = {id(r): r for r in prev}
    after = {id(r): r for r in cur}
    return (
        [r for k, r in before.items() if k not in after],
        [r for k, r in after.items() if k not in before],
    )
