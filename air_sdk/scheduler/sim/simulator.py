"""Discrete-event replay of a job trace on a simulated cluster, driven by the real
scheduling code: `decide` (multi-tenant) or `schedule_fifo` (plain FIFO gang).

Events are arrivals, completions and preempted jobs exiting. After the events of
one instant, one scheduling cycle runs and its decisions are carried out at once:
placements start (and end after their true remaining run time), preempted jobs get
`grace_s` to checkpoint (their resources stay held), then requeue with the work
they had done saved, first in line again (they keep their submit time).

Checks (on by default) make a broken schedule fail loudly: no node is ever given
more slots or GPUs than it has, no GPU twice, every job completes exactly once.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from air_sdk.scheduler.decide import SchedulerState
from air_sdk.scheduler.gang import JobRequest, NodeSpec, schedule_fifo
from air_sdk.scheduler.policy import SchedulerPolicy
from air_sdk.scheduler.sim.metrics import jain_index, normalized_shares
from air_sdk.scheduler.sim.trace import TraceJob, percentile
from air_sdk.scheduler.state import RunningJob
from air_sdk.schema import Placement

SchedulerName = Literal["air", "fifo"]

_FINISH, _EXIT, _ARRIVAL = 0, 1, 2


class SimulationError(AssertionError):
    """The schedule broke an invariant, or the trace cannot finish on this cluster."""


@dataclass(frozen=True)
class JobOutcome:
    """What happened to one job."""

    job_id: str
    tenant: str
    priority: str
    gpus: int
    arrival: float
    first_start: float
    finish: float
    duration: float
    preemptions: int

    @property
    def jct(self) -> float:
        return self.finish - self.arrival

    @property
    def queueing_delay(self) -> float:
        return self.first_start - self.arrival


@dataclass
class SimResult:
    """Outcomes and cluster-level measures of one replay."""

    scheduler: str
    outcomes: list[JobOutcome]
    makespan: float
    #: GPU-seconds of useful work / (GPUs x makespan)
    utilization: float
    #: GPU-seconds held (including preempted jobs' grace periods) / (GPUs x makespan)
    allocated_utilization: float
    #: useful GPU-seconds / GPU capacity while jobs still arrive (first to last arrival):
    #: the steady state, without the drain at the end
    utilization_while_arriving: float
    #: time-averaged Jain's index of tenants' allocation / max-min fair share
    fairness: float
    num_cycles: int
    num_preemptions: int
    scheduler_wall_s: float
    cycle_wall_s: list[float] = field(default_factory=list, repr=False)

    @property
    def avg_jct(self) -> float:
        return sum(o.jct for o in self.outcomes) / len(self.outcomes)

    @property
    def p95_jct(self) -> float:
        return percentile(sorted(o.jct for o in self.outcomes), 95)

    @property
    def avg_queueing_delay(self) -> float:
        return sum(o.queueing_delay for o in self.outcomes) / len(self.outcomes)

    @property
    def p95_queueing_delay(self) -> float:
        return percentile(sorted(o.queueing_delay for o in self.outcomes), 95)

    def summary(self) -> dict[str, float | int | str]:
        return {
            "scheduler": self.scheduler,
            "jobs": len(self.outcomes),
            "avg_jct_s": self.avg_jct,
            "p95_jct_s": self.p95_jct,
            "avg_queueing_delay_s": self.avg_queueing_delay,
            "p95_queueing_delay_s": self.p95_queueing_delay,
            "utilization": self.utilization,
            "allocated_utilization": self.allocated_utilization,
            "utilization_while_arriving": self.utilization_while_arriving,
            "fairness_jain": self.fairness,
            "makespan_s": self.makespan,
            "preemptions": self.num_preemptions,
            "cycles": self.num_cycles,
            "scheduler_wall_s": self.scheduler_wall_s,
        }


@dataclass
class _Run:
    placement: Placement
    start: float
    token: int
    info: RunningJob
    terminating: bool = False
    sigterm_at: float = 0.0


def simulate(
    trace: Sequence[TraceJob],
    inventory: Sequence[NodeSpec],
    *,
    scheduler: SchedulerName = "air",
    policy: SchedulerPolicy | None = None,
    grace_s: float = 30.0,
    check: bool = True,
) -> SimResult:
    """Replay `trace` on `inventory` with `scheduler` and measure the outcome.

    Example:
        >>> from air_sdk.scheduler.sim.trace import generate_trace
        >>> inv = [NodeSpec(f"n{i}", 8, tuple(range(8))) for i in range(4)]
        >>> r = simulate(generate_trace(50, cluster_gpus=32, seed=3), inv)
        >>> len(r.outcomes), r.utilization <= 1.0
        (50, True)
    """
    return _Sim(trace, inventory, scheduler, policy or SchedulerPolicy(), grace_s, check).run()


class _Sim:
    def __init__(
        self,
        trace: Sequence[TraceJob],
        inventory: Sequence[NodeSpec],
        scheduler: SchedulerName,
        policy: SchedulerPolicy,
        grace_s: float,
        check: bool,
    ) -> None:
        if scheduler not in ("air", "fifo"):
            raise ValueError(f"scheduler {scheduler!r}: use 'air' or 'fifo'")
        self.jobs = {j.job_id: j for j in trace}
        if len(self.jobs) != len(trace):
            raise ValueError("trace job ids must be unique")
        self.inventory = list(inventory)
        self.nodes = {n.name: n for n in inventory if n.healthy}
        self.scheduler = scheduler
        self.policy = policy
        self.grace_s = grace_s
        self.check = check
        gpus = sum(n.num_gpus for n in self.nodes.values())
        self.by_gpus = gpus > 0
        self.capacity = float(gpus if self.by_gpus else sum(n.slots for n in self.nodes.values()))
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        for j in trace:
            self._push(j.arrival, _ARRIVAL, j.job_id, 0)
        self.pending: dict[str, JobRequest] = {}
        self.running: dict[str, _Run] = {}
        self.remaining = {j.job_id: j.duration for j in trace}
        self.est_remaining = {j.job_id: j.est_duration for j in trace}
        self.first_start: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.preempted: dict[str, int] = {}
        self.tokens = 0
        self.used_slots: dict[str, int] = {}
        self.used_gpus: dict[str, set[int]] = {}
        self.demand: dict[str, float] = {}
        self.alloc: dict[str, float] = {}
        self.useful = 0.0
        self.allocated = 0.0
        self.held_now = 0.0
        self.useful_now = 0.0
        self.fair_area = 0.0
        self.fair_time = 0.0
        self.last_t = 0.0
        self.window = (
            min((j.arrival for j in trace), default=0.0),
            max((j.arrival for j in trace), default=0.0),
        )
        self.useful_in_window = 0.0
        self.cycles = 0
        self.num_preemptions = 0
        self.wall = 0.0
        self.cycle_wall: list[float] = []
        self.state = SchedulerState()

    def _push(self, t: float, kind: int, job_id: str, token: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, job_id, token))

    def _size(self, job: TraceJob) -> float:
        return float(job.num_gpus if self.by_gpus else job.nodes * job.slots)

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> SimResult:
        while self.events:
            t = self.events[0][0]
            self._advance(t)
            while self.events and self.events[0][0] == t:
                _, kind, _, job_id, token = heapq.heappop(self.events)
                if kind == _ARRIVAL:
                    self._arrive(job_id)
                elif kind == _FINISH:
                    self._finish(job_id, token, t)
                else:
                    self._exit(job_id, token, t)
            self._cycle(t)
            if not self.events and self.pending:
                stuck = ", ".join(sorted(self.pending)[:5])
                raise SimulationError(
                    f"{len(self.pending)} jobs can never start on this cluster ({stuck} ...)"
                )
        return self._result()

    def _advance(self, t: float) -> None:
        dt = t - self.last_t
        if dt > 0:
            self.useful += self.useful_now * dt
            lo, hi = max(self.last_t, self.window[0]), min(t, self.window[1])
            if hi > lo:
                self.useful_in_window += self.useful_now * (hi - lo)
            self.allocated += self.held_now * dt
            active = [k for k, d in self.demand.items() if d > 0]
            if len(active) >= 2:
                x = normalized_shares(self.alloc, self.demand, self.capacity, self.policy.weights)
                self.fair_area += jain_index(x) * dt
                self.fair_time += dt
        self.last_t = t

    def _arrive(self, job_id: str) -> None:
        j = self.jobs[job_id]
        self.pending[job_id] = self._request(j, self.est_remaining[job_id])
        self.demand[j.tenant] = self.demand.get(j.tenant, 0.0) + self._size(j)

    def _request(self, j: TraceJob, est: float | None) -> JobRequest:
        return JobRequest(
            job_id=j.job_id,
            nodes=j.nodes,
            slots_per_node=j.slots,
            gpus_per_node=j.gpus_per_node,
            pool=j.pool,
            accelerator=j.accelerator,
            tenant=j.tenant,
            priority=j.priority,
            submitted_at=j.arrival,
            est_duration_s=est,
        )

    def _cycle(self, t: float) -> None:
        if not self.pending:
            return
        self.cycles += 1
        queue = list(self.pending.values())
        tic = time.perf_counter()
        if self.scheduler == "air":
            running = [r.info for r in self.running.values()]
            d = self.state.decide(queue, self.inventory, running, self.policy, t)
            placements, preemptions = d.placements, d.preemptions
        else:
            queue.sort(key=lambda r: r.submitted_at)
            held = [r.placement for r in self.running.values()]
            placements, preemptions = schedule_fifo(queue, self.inventory, held), []
        took = time.perf_counter() - tic
        self.wall += took
        self.cycle_wall.append(took)
        for p in placements:
            self._start(p, t)
        for pre in preemptions:
            self._preempt(pre.victim_job_id, t)

    # -- transitions ------------------------------------------------------------------------

    def _start(self, p: Placement, t: float) -> None:
        job_id = p.job_id
        if job_id not in self.pending:
            raise SimulationError(f"{job_id} was placed but is not queued")
        del self.pending[job_id]
        j = self.jobs[job_id]
        if self.check:
            self._take(p, j)
        self.tokens += 1
        est = self.est_remaining[job_id]
        info = RunningJob(
            placement=p,
            tenant=j.tenant,
            priority=j.priority,
            started_at=t,
            est_end=None if est is None else t + est,
        )
        self.running[job_id] = _Run(p, t, self.tokens, info)
        self.first_start.setdefault(job_id, t)
        size = self._size(j)
        self.alloc[j.tenant] = self.alloc.get(j.tenant, 0.0) + size
        self.held_now += size
        self.useful_now += size
        self._push(t + self.remaining[job_id], _FINISH, job_id, self.tokens)

    def _take(self, p: Placement, j: TraceJob) -> None:
        if len({a.node for a in p.nodes}) != len(p.nodes) or len(p.nodes) != j.nodes:
            raise SimulationError(f"{p.job_id}: not {j.nodes} distinct nodes: {p.nodes}")
        for a in p.nodes:
            node = self.nodes.get(a.node)
            if node is None:
                raise SimulationError(f"{p.job_id} placed on unknown or unhealthy {a.node}")
            if a.slots != j.slots or len(a.gpus) != j.gpus_per_node:
                raise SimulationError(f"{p.job_id}: wrong shape on {a.node}: {a}")
            used = self.used_slots.get(a.node, 0) + a.slots
            if used > node.slots:
                raise SimulationError(f"{a.node} over-allocated: {used} of {node.slots} slots")
            gpus = self.used_gpus.setdefault(a.node, set())
            if any(g in gpus or g not in node.gpus for g in a.gpus):
                raise SimulationError(f"{a.node}: GPUs {a.gpus} already taken or absent")
            self.used_slots[a.node] = used
            gpus.update(a.gpus)

    def _give_back(self, p: Placement) -> None:
        if not self.check:
            return
        for a in p.nodes:
            self.used_slots[a.node] -= a.slots
            self.used_gpus[a.node].difference_update(a.gpus)

    def _finish(self, job_id: str, token: int, t: float) -> None:
        run = self.running.get(job_id)
        if run is None or run.token != token:
            return  # preempted meanwhile: this end never comes
        if job_id in self.finished:
            raise SimulationError(f"{job_id} completed twice")
        j = self.jobs[job_id]
        del self.running[job_id]
        self._give_back(run.placement)
        size = self._size(j)
        self.alloc[j.tenant] -= size
        self.demand[j.tenant] -= size
        self.held_now -= size
        if not run.terminating:
            self.useful_now -= size
        self.remaining[job_id] = 0.0
        self.finished[job_id] = t

    def _preempt(self, job_id: str, t: float) -> None:
        run = self.running.get(job_id)
        if run is None or run.terminating:
            raise SimulationError(
                f"preemption of {job_id}, which is not running or already stopping"
            )
        j = self.jobs[job_id]
        run.terminating = True
        run.sigterm_at = t
        run.info = RunningJob(
            placement=run.placement,
            tenant=run.info.tenant,
            priority=run.info.priority,
            started_at=run.info.started_at,
            est_end=run.info.est_end,
            terminating=True,
        )
        self.useful_now -= self._size(j)
        self.num_preemptions += 1
        self.preempted[job_id] = self.preempted.get(job_id, 0) + 1
        self._push(t + self.grace_s, _EXIT, job_id, run.token)

    def _exit(self, job_id: str, token: int, t: float) -> None:
        run = self.running.get(job_id)
        if run is None or run.token != token:
            return  # it completed during its grace period
        j = self.jobs[job_id]
        del self.running[job_id]
        self._give_back(run.placement)
        size = self._size(j)
        self.alloc[j.tenant] -= size
        self.held_now -= size
        done = run.sigterm_at - run.start  # checkpointed at SIGTERM: that work is kept
        self.remaining[job_id] = max(self.remaining[job_id] - done, 0.0)
        est = self.est_remaining[job_id]
        if est is not None:
            self.est_remaining[job_id] = max(est - done, 1.0)
        self.pending[job_id] = self._request(j, self.est_remaining[job_id])

    # -- result ------------------------------------------------------------------------------

    def _result(self) -> SimResult:
        missing = set(self.jobs) - set(self.finished)
        if missing:
            raise SimulationError(f"{len(missing)} jobs never completed: {sorted(missing)[:5]}")
        outcomes = [
            JobOutcome(
                job_id=j.job_id,
                tenant=j.tenant,
                priority=j.priority,
                gpus=j.num_gpus,
                arrival=j.arrival,
                first_start=self.first_start[j.job_id],
                finish=self.finished[j.job_id],
                duration=j.duration,
                preemptions=self.preempted.get(j.job_id, 0),
            )
            for j in self.jobs.values()
        ]
        start = min((j.arrival for j in self.jobs.values()), default=0.0)
        makespan = max(self.finished.values(), default=start) - start
        denom = self.capacity * makespan
        work = sum(self._size(j) * j.duration for j in self.jobs.values())
        window = (self.window[1] - self.window[0]) * self.capacity
        result = SimResult(
            scheduler=self.scheduler,
            outcomes=outcomes,
            makespan=makespan,
            utilization=work / denom if denom else 0.0,
            allocated_utilization=self.allocated / denom if denom else 0.0,
            utilization_while_arriving=self.useful_in_window / window if window else 0.0,
            fairness=self.fair_area / self.fair_time if self.fair_time else 1.0,
            num_cycles=self.cycles,
            num_preemptions=self.num_preemptions,
            scheduler_wall_s=self.wall,
            cycle_wall_s=self.cycle_wall,
        )
        if self.check:
            for o in outcomes:
                if o.finish + 1e-6 < o.arrival + o.duration:
                    raise SimulationError(f"{o.job_id} finished faster than it runs")
            for name in ("utilization", "allocated_utilization", "utilization_while_arriving"):
                if getattr(result, name) > 1 + 1e-9:
                    raise SimulationError(f"{name} over 1: {getattr(result, name)}")
        return result


def compare(
    trace: Sequence[TraceJob],
    inventory: Sequence[NodeSpec],
    *,
    policy: SchedulerPolicy | None = None,
    grace_s: float = 30.0,
) -> Mapping[str, SimResult]:
    """The same trace through `decide` and through plain FIFO gang scheduling."""
    return {
        "air": simulate(trace, inventory, scheduler="air", policy=policy, grace_s=grace_s),
        "fifo": simulate(trace, inventory, scheduler="fifo", policy=policy, grace_s=grace_s),
    }
