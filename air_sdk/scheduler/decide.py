"""`decide`: one multi-tenant scheduling cycle as a pure function.

queue + inventory + running jobs + policy + now -> which jobs start where, which
running jobs to preempt, and why every other queued job waits.

The cycle, in order:

1. Order the queue: priority class (high, normal, low; a job that has waited
   `aging_s` counts one class higher), then dominant-resource
   fairness (DRF) across tenants, then submit time. A job's DRF key is its tenant's
   dominant share (the larger of its GPU and slot fractions of the cluster, divided
   by the tenant's weight) once the tenant's earlier queued jobs have started: DRF
   progressive filling, evaluated once per cycle.
2. Walk the order. Each job is routed to the partitions (pool x accelerator) it may
   use; over-quota jobs are skipped (they do not block anyone).
3. A job starts if a gang placement fits now (best fit, locality label kept). The
   first job of a partition that does not fit is its head: it gets a reservation
   (EASY backfill) computed from the expected ends of running jobs, or, if its class
   may preempt, the fewest lowest-priority youngest victims that make it fit.
4. Jobs behind a head start only if they do not delay it: they end (by their
   estimate) before the reservation starts, or they fit in capacity the reservation
   does not need.
5. Every job that did not start gets an explanation and a position in its pool.

`SchedulerState.decide` gives the same decisions and remembers the cluster between
cycles, so that a cycle costs O(changes + nodes) rather than O(running jobs).
"""

from __future__ import annotations

import gc
import heapq
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from air_sdk.scheduler.capacity import Alloc, Capacity, Partition
from air_sdk.scheduler.explain import Explanations, Reason, need_text
from air_sdk.scheduler.gang import ANY_POOL, PRIORITY_RANK, JobRequest, NodeSpec
from air_sdk.scheduler.policy import SchedulerPolicy
from air_sdk.scheduler.preemption import choose_victims
from air_sdk.scheduler.state import ClusterBook, RunningJob
from air_sdk.schema import NodeAssignment, Placement

_INF = math.inf
# an Enum member read through its class costs a metaclass lookup; the walk reads these
# once per waiting job
_NO_FIT = Reason.NO_FIT
_RESERVED = Reason.RESERVED


_UNSEEN: tuple[float, float] = (-1.0, -1.0)

#: a partition where a job waits, why, and the end time before which it must still be
#: tried there (it would end before the head needs the room); -inf: never
_Wait = tuple["PartitionCycle", Reason, float]


def _release_order(r: tuple[float, float, tuple[Alloc, ...]]) -> tuple[float, float]:
    return (r[0], r[1])


_submitted_at = operator.attrgetter("submitted_at")
_job_id = operator.attrgetter("job_id")


@dataclass(frozen=True)
class Preemption:
    """Stop `victim_job_id` (SIGTERM, grace to checkpoint, then requeue) so that
    `for_job_id` can start."""

    victim_job_id: str
    for_job_id: str
    reason: str


@dataclass(frozen=True)
class Reservation:
    """Where and when a partition's blocked head job is expected to start.

    `start_at` is None when it cannot be told: running jobs without an expected end,
    or preempted jobs still exiting."""

    job_id: str
    pool: str
    start_at: float | None
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    """The outcome of one cycle.

    `positions` counts from 1 per pool (1: next to start there); `routes` is the pool
    each waiting job was routed to this cycle; `reservations` is keyed by pool (or
    "pool/accelerator" for a pool of mixed accelerators).
    """

    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    #: {job_id: why it waits}; a Mapping whose sentences are made when read
    explanations: Mapping[str, str] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    routes: dict[str, str] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)


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


def decide(
    queue: Sequence[JobRequest],
    inventory: Sequence[NodeSpec],
    running: Sequence[RunningJob],
    policy: SchedulerPolicy,
    now: float,
) -> Decision:
    """One scheduling cycle: placements, preemptions and explanations.

    `queue` holds the queued jobs (any order; ties in `submitted_at` keep the given
    order), `inventory` every node with its health, `running` every job that holds
    a placement (including ones being stopped, marked `terminating`).

    Example:
        >>> inv = [NodeSpec("n0", 8, tuple(range(8)))]
        >>> q = [JobRequest("big", 1, 8, 8, submitted_at=1), JobRequest("small", 1, 1, 1, submitted_at=2)]
        >>> d = decide(q, inv, [], SchedulerPolicy(), now=10)
        >>> [p.job_id for p in d.placements], d.positions
        (['big'], {'small': 1})
    """
    return SchedulerState().decide(queue, inventory, running, policy, now)


class SchedulerState:
    """`decide` with a memory: the same decisions, but the cluster's capacity and usage
    are updated by difference between cycles instead of rebuilt.

    Example:
        >>> state = SchedulerState()
        >>> inv = [NodeSpec("n0", 2)]
        >>> d = state.decide([JobRequest("a", 1, 1)], inv, [], SchedulerPolicy(), now=0)
        >>> [p.job_id for p in d.placements]
        ['a']
    """

    def __init__(self) -> None:
        self._book = ClusterBook()

    def decide(
        self,
        queue: Sequence[JobRequest],
        inventory: Sequence[NodeSpec],
        running: Sequence[RunningJob],
        policy: SchedulerPolicy,
        now: float,
    ) -> Decision:
        """See `decide`.

        The cyclic garbage collector is paused for the cycle: a full collection in a
        process holding thousands of jobs took up to 100 ms, and it would otherwise
        land inside a decision whenever the cycle's allocations tip it over. The cycle
        creates no reference cycles worth collecting, and the collection runs after it.
        """
        paused = gc.isenabled()
        gc.disable()
        try:
            self._book.sync(inventory, running)
            return _Cycle(self._book, inventory, policy, now).run(queue)
        finally:
            if paused:
                gc.enable()


class _Cycle:
    def __init__(
        self,
        book: ClusterBook,
        inventory: Sequence[NodeSpec],
        policy: SchedulerPolicy,
        now: float,
    ) -> None:
        self.book = book
        self.policy = policy
        self.now = now
        self.inventory = inventory
        self.cap: Capacity = book.capacity.copy()
        self.states = [
            PartitionCycle(p, size=float((p.total_gpus if p.has_gpus else p.total_slots) or 1))
            for p in self.cap.partitions
        ]
        self.total_gpus = sum(p.total_gpus for p in self.cap.partitions)
        self.total_slots = sum(p.total_slots for p in self.cap.partitions)
        self.used_gpus = dict(book.used_gpus)
        self.used_slots = dict(book.used_slots)
        self.positions: dict[str, int] = {}
        self.routes: dict[str, str] = {}
        self.explanations = Explanations(self.positions, now)
        self.decision = Decision(
            explanations=self.explanations, positions=self.positions, routes=self.routes
        )
        self._routes: dict[str, list[PartitionCycle] | str] = {}
        self._locality = policy.locality_label
        self._strict = policy.locality_strict
        self._quotas = policy.quotas
        self._default_quota = policy.default_quota
        #: tenant -> (GPUs, slots) it may still take, None if unlimited; filled on first use
        self._headroom: dict[str, tuple[float, float] | None] = {}
        #: route key (which holds the shape) -> where such a job is known to wait: see
        #: `_waits_as_before`
        self._waits: dict[str, tuple[_Wait, ...]] = {}

    # -- ordering ------------------------------------------------------------------------------

    def order(self, queue: Sequence[JobRequest]) -> list[JobRequest]:
        jobs = list(queue)
        # the runner passes the queue oldest first: then this is one pass (in C), not a sort
        times = list(map(_submitted_at, jobs))
        if any(map(operator.lt, islice(times, 1, None), times)):
            jobs.sort(key=_submitted_at)  # stable: ties keep the given order
        rank = PRIORITY_RANK
        aging = self.policy.aging_s
        now = self.now

        # a job that has waited `aging` is ordered one class higher (two after 2x), but
        # never into a class that may preempt: else a preempted job would come back ahead
        # of the job that preempted it, and the two would take turns forever
        aged_before = -_INF if aging is None else now - aging
        top = 2
        if self.policy.preemption and self.policy.preemptor_priorities:
            top = min(rank[p] for p in self.policy.preemptor_priorities) - 1

        def klass(job: JobRequest) -> int:
            r = rank[job.priority]
            if job.submitted_at <= aged_before and r < top and aging is not None:
                r = min(top, r + int((now - job.submitted_at) // aging))
            return r

        if self.policy.fair_share == "fifo":
            return sorted(jobs, key=lambda j: -klass(j))
        tg = float(self.total_gpus) or _INF
        ts = float(self.total_slots) or _INF
        weights = self.policy.weights
        share: dict[str, float] = {}
        keys: list[float] = []  # the tenant's dominant share before the job
        classes: list[int] = []  # minus the class it is ordered in
        for job in jobs:
            t = job.tenant
            s = share.get(t)
            if s is None:
                g0, s0 = self.used_gpus.get(t, 0) / tg, self.used_slots.get(t, 0) / ts
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

    # -- the walk -----------------------------------------------------------------------------

    def run(self, queue: Sequence[JobRequest]) -> Decision:
        known = self._waits
        headroom = self._headroom
        now = self.now
        consider = self.consider
        for job in self.order(queue):
            # `consider`'s fast path, inline (most jobs of a busy cycle take it): a job
            # within quota, of a route and shape already known to wait
            waits = known.get(job.route_key)
            if waits is not None:
                room = headroom.get(job.tenant, _UNSEEN)
                if room is None or (
                    room is not _UNSEEN and job.num_gpus <= room[0] and job.num_slots <= room[1]
                ):
                    est = job.est_duration_s
                    if self._wait_in(waits, job, _INF if est is None else now + est):
                        continue
            consider(job)
        for st in self.states:  # each partition's line, in C rather than per job
            ids = list(map(_job_id, st.waiting))
            self.positions.update(zip(ids, range(1, len(ids) + 1), strict=True))
            self.routes.update(dict.fromkeys(ids, st.part.pool))
        self.explanations.add_lines(self.states)
        return self.decision

    def _route(self, job: JobRequest) -> list[PartitionCycle] | str:
        """The partitions that could ever hold the job, or why none can."""
        key = job.route_key
        found = self._routes.get(key)
        if found is not None:
            return found
        wanted = job.accelerator.lower() if job.accelerator else None
        candidates = []
        for st in self.states:
            p = st.part
            if job.pool != ANY_POOL and p.pool != job.pool:
                continue
            if wanted is not None and not (
                (wanted == "gpu" and p.has_gpus) or p.accelerator.lower() == wanted
            ):
                continue
            candidates.append(st)
        if not candidates:
            found = self._no_partition(job)
        else:
            n, s, g = job.shape
            feasible = [st for st in candidates if st.part.can_ever(n, s, g)]
            if feasible:
                found = feasible
            else:
                best = max(st.part.capable(s, g) for st in candidates)
                where = "any pool" if job.pool == ANY_POOL else f"pool {job.pool!r}"
                found = (
                    f"never fits: {need_text(job)}; {where} has only {best} such healthy"
                    " nodes: lower --nodes or the GPUs/ranks per node"
                )
        self._routes[key] = found
        return found

    def consider(self, job: JobRequest) -> None:
        route = self._routes.get(job.route_key)
        if route is None:
            route = self._route(job)
        if isinstance(route, str):
            self.explanations.put(job.job_id, route)
            return
        headroom = self._headroom.get(job.tenant, _UNSEEN)
        if headroom is _UNSEEN:
            headroom = self._headroom[job.tenant] = self._quota_left(job.tenant)
        if headroom is not None and (job.num_gpus > headroom[0] or job.num_slots > headroom[1]):
            self.explanations.put(job.job_id, self._quota_problem(job))
            return
        if self._waits_as_before(route, job):
            return
        if len(route) > 1:
            route = sorted(route, key=self._route_order)
        first_reason = None
        for st in route:
            nodes, reason = self._try_start(st, job)
            if nodes is not None:
                self._start(st, job, nodes)
                return
            if first_reason is None:
                first_reason = reason
        without_head = [st for st in route if st.head is None]
        if without_head:
            self._block_head(without_head[0], job, without_head)
            return
        assert first_reason is not None
        self._block(route[0], job, first_reason)

    def _waits_as_before(self, route: list[PartitionCycle], job: JobRequest) -> bool:
        """The fast path, the common case in a busy pool: if every partition the job may
        use has a head, and a shape no larger than the job's already failed in each this
        cycle (alone, or beside the head's reservation), the job fails too (capacity only
        shrinks within a cycle): it waits where the least demand is ahead, relative to
        the partition's size. False if it has to be tried.

        What is found for a (route, shape) holds for the rest of the cycle (heads and
        their reservations stay, failed shapes keep failing) until a search fails
        anew (`_find`), which may turn "reserved" into "does not fit"; until then the
        next job of that route and shape costs one lookup."""
        waits = self._waits.get(job.route_key)  # the key holds the shape
        if waits is None:
            waits = self._where_it_fails(route, job.shape)
            if waits is None:
                return False
            self._waits[job.route_key] = waits
        est = job.est_duration_s
        return self._wait_in(waits, job, _INF if est is None else self.now + est)

    @staticmethod
    def _wait_in(waits: tuple[_Wait, ...], job: JobRequest, end: float) -> bool:
        """Put `job` in line where it is known to wait, in the partition with the least
        demand ahead relative to its size (as `_block` does, without one more call per
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

    def _where_it_fails(
        self, route: list[PartitionCycle], shape: tuple[int, int, int]
    ) -> tuple[_Wait, ...] | None:
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

    def _route_order(self, st: PartitionCycle) -> tuple[float, str]:
        """Where a job that may go to several pools is tried first: least demand queued
        ahead of it, relative to the pool's size."""
        return (self._load_ahead(st), st.part.label)

    def _load_ahead(self, st: PartitionCycle) -> float:
        return st.demand_ahead / st.size

    def _quota_left(self, tenant: str) -> tuple[float, float] | None:
        q = self._quotas.get(tenant, self._default_quota)
        if q.gpus is None and q.slots is None:
            return None
        g = _INF if q.gpus is None else q.gpus - self.used_gpus.get(tenant, 0)
        s = _INF if q.slots is None else q.slots - self.used_slots.get(tenant, 0)
        return (g, s)

    def _quota_problem(self, job: JobRequest) -> str:
        t = job.tenant
        q = self._quotas.get(t, self._default_quota)
        used_g, used_s = self.used_gpus.get(t, 0), self.used_slots.get(t, 0)
        gpus, slots = job.num_gpus, job.num_slots
        if q.gpus is not None and gpus > q.gpus:
            return (
                f"the job needs {gpus} GPUs; tenant {t!r} may hold at most {q.gpus}:"
                " lower --nodes or --gpus-per-node, or raise the tenant's quota"
            )
        if q.slots is not None and slots > q.slots:
            return (
                f"the job needs {slots} slots; tenant {t!r} may hold at most {q.slots}:"
                " lower --nodes or --procs-per-node, or raise the tenant's quota"
            )
        if q.gpus is not None and used_g + gpus > q.gpus:
            return (
                f"over quota: tenant {t!r} uses {used_g} of its {q.gpus} GPUs;"
                f" this job needs {gpus} more"
            )
        return (
            f"over quota: tenant {t!r} uses {used_s} of its {q.slots} slots;"
            f" this job needs {slots} more"
        )

    def _find(
        self, st: PartitionCycle, job: JobRequest, cap: dict[int, list[int]] | None = None
    ) -> list[int] | None:
        found = self.cap.find(
            st.part,
            job.nodes,
            job.slots_per_node,
            job.gpus_per_node,
            cap=cap,
            locality_label=self._locality,
            strict_locality=self._strict,
        )
        if found is None and self._waits:
            self._waits.clear()  # a shape may have failed anew: see `_waits_as_before`
        return found

    def _try_start(self, st: PartitionCycle, job: JobRequest) -> tuple[list[int] | None, Reason]:
        if st.head is None:
            return self._find(st, job), Reason.NO_FIT
        if not self.policy.backfill:
            return None, Reason.BEHIND
        est = job.est_duration_s
        if st.res_start is not None and est is not None and self.now + est <= st.res_start:
            return self._find(st, job), Reason.NO_FIT  # ends before the head needs the room
        nodes = self._find(st, job, st.res_spare)
        if nodes is None:
            # RESERVED if it would fit but for the reservation: `explain` tells the two
            # apart once, from the capacity left at the end of the cycle
            return None, Reason.RESERVED
        spare = st.res_spare
        if spare:
            s, g = job.slots_per_node, job.gpus_per_node
            for i in nodes:
                left = spare.get(i)
                if left is not None:
                    left[0] -= s
                    left[1] -= g
        return nodes, Reason.NO_FIT

    def _start(self, st: PartitionCycle, job: JobRequest, nodes: list[int]) -> None:
        cap = self.cap
        s, g = job.slots_per_node, job.gpus_per_node
        names = cap.names
        assignments = []
        allocs = []
        for i in sorted(nodes, key=names.__getitem__):
            ids = cap.allocate(i, s, g)
            # built without validation: the values are valid by construction
            assignments.append(NodeAssignment.model_construct(node=names[i], slots=s, gpus=ids))
            allocs.append((i, s, g))
        self.decision.placements.append(
            Placement.model_construct(
                job_id=job.job_id, pool=st.part.pool, nodes=tuple(assignments)
            )
        )
        t = job.tenant
        self.used_gpus[t] = self.used_gpus.get(t, 0) + job.num_gpus
        self.used_slots[t] = self.used_slots.get(t, 0) + job.num_slots
        self._headroom[t] = self._quota_left(t)
        end = _INF if job.est_duration_s is None else self.now + job.est_duration_s
        st.started.append((end, -self.now, tuple(allocs)))

    def _block(self, st: PartitionCycle, job: JobRequest, reason: Reason) -> None:
        # positions, routes and sentences are made from the lines once the walk ends
        st.waiting.append(job)
        st.reasons.append(reason)
        st.demand_ahead += job.num_gpus if st.part.has_gpus else job.num_slots

    # -- heads: reservations and preemption ----------------------------------------------------

    def _block_head(
        self, st: PartitionCycle, job: JobRequest, routes: list[PartitionCycle]
    ) -> None:
        if self.policy.preemption and job.priority in self.policy.preemptor_priorities:
            rank = PRIORITY_RANK[job.priority]
            best = None
            for cand in routes:
                p = cand.part
                terminating = self.book.terminating(p.index)
                plan = choose_victims(
                    self.cap,
                    p,
                    job,
                    [allocs for _, allocs in terminating],
                    self.book.clearing_set,
                    rank,
                    self.now,
                )
                if plan is not None and (best is None or plan.cost() < best[0]):
                    best = (plan.cost(), cand, plan, [j for j, _ in terminating])
            if best is not None:
                _, st, plan, terminating_ids = best
                if plan.victims:
                    reason = Reason.PREEMPTING
                    st.waiting_for = tuple(v.job_id for v in plan.victims)
                    names = ", ".join(st.waiting_for)
                    where = f"{need_text(job)} in pool {st.part.label!r}"
                    for v in plan.victims:
                        self.decision.preemptions.append(
                            Preemption(
                                victim_job_id=v.job_id,
                                for_job_id=job.job_id,
                                reason=(
                                    f"preempted for {job.priority}-priority job {job.job_id}"
                                    f" ({where}); victims: {names}"
                                ),
                            )
                        )
                else:
                    reason = Reason.WAITING_EXIT
                    st.waiting_for = tuple(terminating_ids)
                st.head = job
                st.res_start = None
                st.res_nodes = tuple(plan.nodes)
                st.res_spare = plan.spare
                self._record_reservation(st, job)
                self._block(st, job, reason)
                return
        st.head = job
        self._reserve(st, job)
        self._record_reservation(st, job)
        self._block(st, job, Reason.HEAD)

    def _record_reservation(self, st: PartitionCycle, job: JobRequest) -> None:
        self.decision.reservations[st.part.label] = Reservation(
            job_id=job.job_id,
            pool=st.part.pool,
            start_at=st.res_start,
            nodes=tuple(sorted(self.cap.names[i] for i in st.res_nodes)),
        )

    def _releases(self, st: PartitionCycle) -> Iterator[tuple[float, float, tuple[Alloc, ...]]]:
        mine = sorted(st.started, key=_release_order)
        return heapq.merge(self.book.releases(st.part.index, self.now), mine, key=_release_order)

    def _reserve(self, st: PartitionCycle, job: JobRequest) -> None:
        """EASY reservation: the earliest time enough running jobs will have ended (by
        their expected ends) for the head to fit, the nodes it would take then, and what
        those nodes have to spare for backfill."""
        cap = self.cap
        n, s, g = job.nodes, job.slots_per_node, job.gpus_per_node
        free_then: dict[int, list[int]] = {}
        ready = {i for i in st.part.nodes if cap.free_slots[i] >= s and cap.free_gpus(i) >= g}
        start: float | None = self.now if len(ready) >= n else None
        if start is None:
            for end, _, allocs in self._releases(st):
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

    def _no_partition(self, job: JobRequest) -> str:
        pools = sorted({p.pool for p in self.cap.partitions})
        if job.pool != ANY_POOL and job.pool not in pools:
            if any(n.pool == job.pool for n in self.inventory):
                return f"pool {job.pool!r} has no healthy nodes now"
            return f"no pool named {job.pool!r}; pools: {', '.join(pools) or 'none'}"
        kinds = sorted(
            {p.accelerator for p in self.cap.partitions if job.pool in (ANY_POOL, p.pool)}
        )
        where = "no pool" if job.pool == ANY_POOL else f"pool {job.pool!r}"
        return f"{where} has {job.accelerator!r} nodes; accelerators here: {', '.join(kinds) or 'none'}"
