"""`decide`: one multi-tenant scheduling cycle as a pure function.

queue + inventory + running jobs + policy + now -> which jobs start where, which
running jobs to preempt, and why every other queued job waits.

The cycle, in order (this module is the walk; each step names where its idea lives):

1. Order the queue (`ordering`): priority class (high, normal, low; a job that
   has waited `aging_s` counts one class higher), then dominant-resource fairness
   (DRF) across tenants, then submit time.
2. Walk the order. Each job is routed to the partitions (pool x accelerator) it may
   use; over-quota jobs are skipped, they do not block anyone (`admission`).
3. A job starts if a gang placement fits now (best fit, locality label kept;
   `capacity`). The first job of a partition that does not fit is its head: it
   gets a reservation (EASY backfill) computed from the expected ends of running
   jobs, or, if its class may preempt, the fewest lowest-priority youngest victims
   that make it fit (`heads`, `preemption`).
4. Jobs behind a head start only if they do not delay it: they end (by their
   estimate) before the reservation starts, or they fit in capacity the reservation
   does not need. A job of a route and shape already known to fail waits at the
   cost of one lookup (`waits`).
5. Every job that did not start gets a position in its pool's line (`waits`) and an
   explanation (`explain`). The outcome is a `Decision` (`decision`).

`SchedulerState.decide` gives the same decisions and remembers the cluster between
cycles (`state.ClusterBook`), so that a cycle costs O(changes + nodes) rather than
O(running jobs).
"""

from __future__ import annotations

import gc
import math
import operator
from collections.abc import Sequence

from air_sdk.scheduler.admission import quota_left, quota_problem, route
from air_sdk.scheduler.capacity import Capacity
from air_sdk.scheduler.decision import Decision, Preemption, Reservation
from air_sdk.scheduler.explain import Explanations, Reason
from air_sdk.scheduler.gang import JobRequest, NodeSpec
from air_sdk.scheduler.heads import plan_preemption, preemptions_for, reserve
from air_sdk.scheduler.ordering import order_queue
from air_sdk.scheduler.policy import SchedulerPolicy
from air_sdk.scheduler.state import ClusterBook, RunningJob
from air_sdk.scheduler.waits import (
    PartitionCycle,
    WaitMemo,
    join_line,
    wait_in,
    waits_as_before,
)
from air_sdk.schema import NodeAssignment, Placement

__all__ = ["Decision", "Preemption", "Reservation", "SchedulerState", "decide"]

_INF = math.inf
_UNSEEN: tuple[float, float] = (-1.0, -1.0)
_job_id = operator.attrgetter("job_id")


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
    """One walk of the queue over a copy of the book's capacity; builds the Decision."""

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
        #: route key -> the partitions such a job may use, or why none can
        self._routes: dict[str, list[PartitionCycle] | str] = {}
        self._locality = policy.locality_label
        self._strict = policy.locality_strict
        self._quotas = policy.quotas
        self._default_quota = policy.default_quota
        #: tenant -> (GPUs, slots) it may still take, None if unlimited; filled on first use
        self._headroom: dict[str, tuple[float, float] | None] = {}
        #: where a job of a route and shape is known to wait: see `waits.waits_as_before`
        self._waits: WaitMemo = {}

    # -- the walk -----------------------------------------------------------------------------

    def run(self, queue: Sequence[JobRequest]) -> Decision:
        known = self._waits
        headroom = self._headroom
        now = self.now
        consider = self.consider
        order = order_queue(
            queue,
            self.policy,
            now,
            self.used_gpus,
            self.used_slots,
            total_gpus=self.total_gpus,
            total_slots=self.total_slots,
        )
        for job in order:
            # `consider`'s fast path, inline (most jobs of a busy cycle take it): a job
            # within quota, of a route and shape already known to wait
            waits = known.get(job.route_key)
            if waits is not None:
                room = headroom.get(job.tenant, _UNSEEN)
                if room is None or (
                    room is not _UNSEEN and job.num_gpus <= room[0] and job.num_slots <= room[1]
                ):
                    est = job.est_duration_s
                    if wait_in(waits, job, _INF if est is None else now + est):
                        continue
            consider(job)
        for st in self.states:  # each partition's line, in C rather than per job
            ids = list(map(_job_id, st.waiting))
            self.positions.update(zip(ids, range(1, len(ids) + 1), strict=True))
            self.routes.update(dict.fromkeys(ids, st.part.pool))
        self.explanations.add_lines(self.states)
        return self.decision

    def consider(self, job: JobRequest) -> None:
        found = self._routes.get(job.route_key)
        if found is None:
            found = self._routes[job.route_key] = route(job, self.states, self.inventory)
        if isinstance(found, str):
            self.explanations.put(job.job_id, found)
            return
        headroom = self._headroom.get(job.tenant, _UNSEEN)
        if headroom is _UNSEEN:
            headroom = self._headroom[job.tenant] = self._quota_left(job.tenant)
        if headroom is not None and (job.num_gpus > headroom[0] or job.num_slots > headroom[1]):
            t = job.tenant
            quota = self._quotas.get(t, self._default_quota)
            problem = quota_problem(job, quota, self.used_gpus.get(t, 0), self.used_slots.get(t, 0))
            self.explanations.put(job.job_id, problem)
            return
        if waits_as_before(self._waits, found, job, self.now):
            return
        if len(found) > 1:
            found = sorted(found, key=_route_order)
        first_reason = None
        for st in found:
            nodes, reason = self._try_start(st, job)
            if nodes is not None:
                self._start(st, job, nodes)
                return
            if first_reason is None:
                first_reason = reason
        without_head = [st for st in found if st.head is None]
        if without_head:
            self._block_head(without_head[0], job, without_head)
            return
        assert first_reason is not None
        join_line(found[0], job, first_reason)

    def _quota_left(self, tenant: str) -> tuple[float, float] | None:
        quota = self._quotas.get(tenant, self._default_quota)
        return quota_left(quota, self.used_gpus.get(tenant, 0), self.used_slots.get(tenant, 0))

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
            self._waits.clear()  # a shape may have failed anew: see `waits_as_before`
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

    # -- heads: preemption or a reservation (see `heads`) ----------------------------------------

    def _block_head(
        self, st: PartitionCycle, job: JobRequest, routes: list[PartitionCycle]
    ) -> None:
        if self.policy.preemption and job.priority in self.policy.preemptor_priorities:
            found = plan_preemption(self.cap, self.book, routes, job, self.now)
            if found is not None:
                st, plan, terminating_ids = found
                if plan.victims:
                    reason = Reason.PREEMPTING
                    st.waiting_for = tuple(v.job_id for v in plan.victims)
                    self.decision.preemptions.extend(preemptions_for(job, st, plan))
                else:
                    reason = Reason.WAITING_EXIT
                    st.waiting_for = tuple(terminating_ids)
                st.head = job
                st.res_start = None
                st.res_nodes = tuple(plan.nodes)
                st.res_spare = plan.spare
                self._record_reservation(st, job)
                join_line(st, job, reason)
                return
        st.head = job
        reserve(st, job, self.cap, self.book, self.now)
        self._record_reservation(st, job)
        join_line(st, job, Reason.HEAD)

    def _record_reservation(self, st: PartitionCycle, job: JobRequest) -> None:
        self.decision.reservations[st.part.label] = Reservation(
            job_id=job.job_id,
            pool=st.part.pool,
            start_at=st.res_start,
            nodes=tuple(sorted(self.cap.names[i] for i in st.res_nodes)),
        )


def _route_order(st: PartitionCycle) -> tuple[float, str]:
    """Where a job that may go to several pools is tried first: least demand queued
    ahead of it, relative to the pool's size."""
    return (st.demand_ahead / st.size, st.part.label)
