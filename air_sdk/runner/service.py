"""The runner: turns queued jobs into placements and keeps one controller per job.

One scheduling thread asks the (pure) scheduler (`SchedulerState.decide`:
priorities, quotas, fair share, backfill, preemption) which queued jobs start now
and starts a controller thread for each; a controller's placement is held until
its job ends or goes back to the queue. Preemptions are handed to the victim's
controller, which stops it gracefully and requeues it. The runner reads and
writes only the store, never HTTP.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from air_sdk.runner.backends.base import Backend
from air_sdk.runner.controller import DEFAULT_MAX_PREEMPTION_GRACE_S, JobController
from air_sdk.runner.job_files import JobPaths
from air_sdk.runner.machine import MachineCap, never_fits, oversubscribed_by
from air_sdk.runner.node_health import NodeHealthBook
from air_sdk.runner.node_probe import NodeProber
from air_sdk.runner.outputs import default_output_dir
from air_sdk.runner.policy import NodeHealthPolicy
from air_sdk.runner.retention import RetentionPolicy, collect_garbage
from air_sdk.runner.slo_watch import SloWatch
from air_sdk.scheduler import (
    JobRequest,
    NodeSpec,
    RunningJob,
    SchedulerPolicy,
    SchedulerState,
)
from air_sdk.scheduler.tenancy import RESTART_WINDOW_S, TenantCrashes, mask_foreign_jobs
from air_sdk.schema import (
    Alert,
    FailureInfo,
    GcReport,
    JobLimits,
    JobRecord,
    JobSpec,
    JobState,
    Placement,
)
from air_sdk.store import ACTIVE_STATES, SqliteStore

log = logging.getLogger(__name__)

#: where, under the gateway's home, bundles are unpacked once each
CODE_CACHE_DIR = "code-cache"
#: how often ended jobs' files are checked against the retention policy
RETENTION_EVERY_S = 3600.0


def spec_request(
    job_id: str, spec: JobSpec, *, tenant: str = "default", submitted_at: float = 0.0
) -> JobRequest:
    """What the scheduler needs of a job. A time limit is the best estimate of how long
    it runs (it never runs longer), so backfill can use it."""
    r = spec.resources
    return JobRequest(
        job_id=job_id,
        nodes=r.nodes,
        slots_per_node=r.ranks_per_node,
        gpus_per_node=r.gpus_per_node,
        pool=spec.pool,
        accelerator=spec.accelerator,
        tenant=tenant,
        priority=spec.priority,
        submitted_at=submitted_at,
        est_duration_s=spec.timeout_s,
    )


def job_request(job: JobRecord) -> JobRequest:
    """A queued job's request; a requeued (e.g. preempted) job keeps its first submit
    time, so it is first in line again among its peers."""
    return spec_request(job.id, job.spec, tenant=job.tenant, submitted_at=job.created_at)


class Runner:
    """Schedules queued jobs onto the backend's inventory and runs their controllers.

    Example:
        >>> runner = Runner(store, LocalBackend(2), home, "http://127.0.0.1:8470")  # doctest: +SKIP
        >>> runner.start()  # doctest: +SKIP
    """

    def __init__(
        self,
        store: SqliteStore,
        backend: Backend,
        home: Path,
        gateway_url: str,
        *,
        tick_s: float = 0.1,
        node_health: NodeHealthPolicy | None = None,
        policy: SchedulerPolicy | None = None,
        retention: RetentionPolicy | None = None,
        max_preemption_grace_s: float = DEFAULT_MAX_PREEMPTION_GRACE_S,
        limit_caps: JobLimits | None = None,
        node_probe: Sequence[str] | None = None,
        node_probe_interval_s: float = 60.0,
    ) -> None:
        self.store = store
        self.backend = backend
        self.home = home
        self.gateway_url = gateway_url
        from air_sdk.bundle.cache import BundleCache

        #: unpacked bundles, shared by one tenant's jobs that run them (by sha256; one
        #: cache per tenant under it: `BundleCache.for_tenant`)
        self.code_cache = BundleCache(home / CODE_CACHE_DIR)
        #: when ended jobs' files go (swept every RETENTION_EVERY_S, and by `air gc`)
        self.retention = retention or RetentionPolicy()
        self._next_sweep = 0.0
        self.tick_s = tick_s
        self.node_health = node_health or NodeHealthPolicy()
        self.node_book = NodeHealthBook()
        #: the operator's node health probe (`--node-probe`), run on every node
        self.prober = (
            NodeProber(
                node_probe, node_probe_interval_s, backend.inventory, self.node_book,
                on_change=self.wake,
            )
            if node_probe
            else None
        )  # fmt: skip
        self.policy = policy or SchedulerPolicy()
        #: the operator's cap on a job's `failure.preemption_grace_s` (submits above it
        #: are refused; a job stored before the cap was lowered gets the cap)
        self.max_preemption_grace_s = max_preemption_grace_s
        #: the tenants' SLOs, re-measured on the state changes that feed them
        self.slo_watch = SloWatch(store, self.policy)
        store.add_transition_listener(self.slo_watch.on_transition)
        #: called with each scheduling cycle's seconds (the gateway's /metrics)
        self.cycle_observers: list[Callable[[float], None]] = []
        #: the operator's caps on a job's limits (submits above them are refused; a job
        #: runs under the smaller of its own and the caps, also one stored before)
        self.limit_caps = limit_caps or JobLimits()
        self._sched = SchedulerState()
        #: the scheduler's view of each job holding a placement, kept between cycles
        #: (SchedulerState diffs by identity first)
        self._running: dict[str, RunningJob] = {}
        #: why each queued job waits and its place in its pool's line, from the last cycle
        self._explanations: Mapping[str, str] = {}
        self._positions: dict[str, int] = {}
        #: the tenant of every job the last cycle saw (queued or holding a placement), so
        #: reasons name another tenant's job only as "another tenant's job"
        self._tenant_of: dict[str, str] = {}
        self._controllers: dict[str, JobController] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._recover()
        if self.prober is not None:
            self.prober.start()
        self._thread = threading.Thread(target=self._loop, name="air-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop scheduling and watching. Jobs keep running: their processes do not
        depend on the gateway, and the next gateway on this home re-attaches to them."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            threads = list(self._threads.values())
        for t in threads:
            t.join(timeout_s)
        if self.prober is not None:
            self.prober.stop(timeout_s)
        getattr(self.backend, "close", lambda: None)()  # jobs keep running

    def wake(self) -> None:
        """Schedule now (called after a submit or cancel) instead of at the next tick."""
        self._wake.set()

    def unhealthy_nodes(self) -> set[str]:
        """Nodes the evidence of several tenants' failures (or a probe) keeps out of
        placements (`NodeHealthPolicy`); the one source of health for the scheduler,
        /v1/cluster and `air admin node list`."""
        num_tenants = len(self.store.list_tenants())
        bad = self.node_health.unhealthy(
            self.node_book.evidence(), time.time(), num_tenants=num_tenants
        )
        return bad | (self.prober.failing() if self.prober is not None else set())

    def probe_node(self, node: str) -> None:
        """A job just failed on `node`: run the operator's probe there now (if any)."""
        if self.prober is not None:
            self.prober.probe_now(node)

    def tenant_crashes(self, tenant: str) -> TenantCrashes:
        """`tenant`'s charged failures over the last hour against its restart allowance
        (`max_restarts_per_hour` in the cluster file): what its failing jobs' controllers
        and `air admin tenant list` read."""
        num, oldest = self.store.crashes_by_tenant(time.time() - RESTART_WINDOW_S).get(
            tenant, (0, None)
        )
        return TenantCrashes(tenant, num, self.policy.restarts_per_hour_for(tenant), oldest)

    def clear_node(self, node: str) -> None:
        """An admin vouches for `node`: its failures are forgotten, jobs go there again."""
        self.store.clear_node_failures(node)
        self.node_book.clear(node)
        if self.prober is not None:
            self.prober.forget(node)
        self.wake()

    def inventory(self) -> list[NodeSpec]:
        """The backend's nodes, with the ones failures made unhealthy marked so."""
        bad = self.unhealthy_nodes()
        return [
            dataclasses.replace(n, healthy=False) if n.name in bad else n
            for n in self.backend.inventory()
        ]

    def held_placements(self) -> list[Placement]:
        return [p for p, _ in self.held_jobs()]

    def held_jobs(self) -> list[tuple[Placement, str]]:
        """Every held placement with the tenant of its job."""
        with self._lock:
            return [(c.placement, c.tenant) for c in self._controllers.values()]

    def queue_info(self, job_id: str) -> tuple[str | None, int | None]:
        """Why a queued job waits and its position in its pool's line (1: next), as of
        the last scheduling cycle; (None, None) for a job the scheduler has not seen
        waiting. Another tenant's job is not named in the reason."""
        reason = self._explanations.get(job_id)
        tenant = self._tenant_of.get(job_id)
        if reason is not None and tenant is not None:
            reason = mask_foreign_jobs(reason, tenant, self._tenant_of)
        return reason, self._positions.get(job_id)

    # -- loop ----------------------------------------------------------------------------

    def collect_garbage(
        self,
        *,
        dry_run: bool = False,
        older_than_s: float | None = None,
        include_checkpoints: bool = False,
    ) -> GcReport:
        """The files of ended jobs the retention policy selects (or, with `older_than_s`,
        those that ended longer ago than that), and unpacked bundles no job uses: gone,
        or in a dry run counted. Checkpoints under a job stay unless the policy or
        `include_checkpoints` says they go."""
        policy = self.retention
        if older_than_s is not None:
            policy = dataclasses.replace(policy, max_age_s=older_than_s)
        if include_checkpoints:
            policy = dataclasses.replace(policy, include_checkpoints=True)
        return collect_garbage(
            self.store,
            self.home / "jobs",
            self.code_cache,
            policy,
            dry_run=dry_run,
            bundles_dir=self.home / "bundles",
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            try:
                self.schedule_once()
            except Exception:  # the loop must outlive any one bad cycle
                log.exception("scheduling cycle failed")
            for observe in self.cycle_observers:
                observe(time.perf_counter() - began)
            if time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + RETENTION_EVERY_S
                try:
                    self.collect_garbage()
                except Exception:  # a full or read-only disk must not stop scheduling
                    log.exception("retention sweep failed")
            self._wake.wait(self.tick_s)
            self._wake.clear()

    def schedule_once(self) -> list[str]:
        """One scheduling cycle: ask the scheduler which queued jobs start where and
        which running jobs to preempt, and carry it out. Returns the ids started."""
        with self._lock:
            for job_id in [j for j, t in self._threads.items() if not t.is_alive()]:
                del self._threads[job_id]
                del self._controllers[job_id]
            live = set(self._controllers)
        queued = self.store.list_jobs(states=(JobState.QUEUED,), oldest_first=True, limit=10_000)
        everything = self.backend.inventory()
        cap = MachineCap.of(everything)
        requests = []
        for job in queued:
            if job.id in live:
                continue  # its old controller is still letting go of its placement
            req = job_request(job)
            never = never_fits(req, everything)
            if never is not None:
                self.store.transition(
                    job.id,
                    JobState.FAILED,
                    never,
                    failure=FailureInfo(attempt=job.attempt, reason=never),
                    expect=(JobState.QUEUED,),
                )
                continue
            requests.append(req)
        running = self._running_jobs()
        tenant_of = {r.job_id: r.tenant for r in requests}
        tenant_of.update((r.job_id, r.tenant) for r in running)
        decision = self._sched.decide(requests, self.inventory(), running, self.policy, time.time())
        placements = list(decision.placements)
        explanations = dict(decision.explanations)
        held_by_cap: list[Placement] = []
        if cap is not None:  # this machine's virtual nodes share its cores
            placements, held_by_cap = cap.admit(placements, [r.placement for r in running])
            busy = [*(r.placement for r in running), *placements]
            for held in held_by_cap:
                explanations[held.job_id] = cap.waiting_reason(busy)
        if self.policy.slos or self.policy.default_slos:
            started_now = {p.job_id for p in placements}
            waiting = [j for j in queued if j.id in explanations and j.id not in started_now]
            for job_id, note in self.slo_watch.queue_notes(waiting, time.time()).items():
                explanations[job_id] = f"{explanations[job_id]}; {note}"
        started = []
        for placement in placements:
            scheduled = self.store.transition(
                placement.job_id,
                JobState.SCHEDULED,
                "placed on " + ", ".join(a.node for a in placement.nodes),
                expect=(JobState.QUEUED,),
            )
            if scheduled is None:
                continue  # cancelled meanwhile
            crowded = oversubscribed_by(placement, [r.placement for r in running], everything)
            if crowded is not None:
                self.store.append_event(scheduled.id, Alert(kind="oversubscribed", detail=crowded))
            self._start_controller(self._controller(scheduled, placement))
            started.append(scheduled.id)
            running.append(RunningJob(placement, tenant=scheduled.tenant))
        for p in decision.preemptions:
            with self._lock:
                victim = self._controllers.get(p.victim_job_id)
            # The victim's events say why, without naming another tenant's job.
            if victim is not None and victim.preempt(
                mask_foreign_jobs(p.reason, victim.tenant, tenant_of)
            ):
                log.info("preempting %s for %s: %s", p.victim_job_id, p.for_job_id, p.reason)
        self._tenant_of = tenant_of
        self._explanations = explanations
        self._positions = decision.positions
        return started

    def _running_jobs(self) -> list[RunningJob]:
        """The scheduler's view of every job holding a placement. An unchanged job keeps
        its RunningJob object from cycle to cycle."""
        with self._lock:
            controllers = dict(self._controllers)
        running: dict[str, RunningJob] = {}
        for job_id, ctl in controllers.items():
            old = self._running.get(job_id)
            terminating = ctl.stopping
            if (
                old is not None
                and old.placement is ctl.placement
                and old.terminating == terminating
            ):
                running[job_id] = old
                continue
            limit = ctl.spec.timeout_s
            running[job_id] = RunningJob(
                ctl.placement,
                tenant=ctl.tenant,
                priority=ctl.spec.priority,
                started_at=ctl.scheduled_at,
                est_end=ctl.scheduled_at + limit if limit is not None else None,
                terminating=terminating,
            )
        self._running = running
        return list(running.values())

    @property
    def output_storage(self) -> str | None:
        """The backend's storage every node shares (Ray's `AIR_RAY_STORAGE`), or None."""
        storage = getattr(self.backend, "storage", None)  # only the Ray backend has one
        return storage if isinstance(storage, str) and storage else None

    def output_dir(self, job_id: str) -> str:
        """Where the job keeps its outputs unless it named a place (`AIR_OUTPUT_DIR`):
        `air_sdk.runner.outputs.default_output_dir` for this gateway and backend."""
        return default_output_dir(job_id=job_id, home=self.home, storage=self.output_storage)

    def _controller(self, job: JobRecord, placement: Placement) -> JobController:
        limits = job.spec.limits.capped(self.limit_caps)
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"limits": limits})})
        return JobController(
            self.store,
            self.backend,
            job,
            placement,
            JobPaths(self.home / "jobs" / job.id, outputs=self.output_dir(job.id)),
            self.gateway_url,
            unhealthy_nodes=self.unhealthy_nodes,
            node_book=self.node_book,
            max_preemption_grace_s=self.max_preemption_grace_s,
            tenant_crashes=self.tenant_crashes,
            probe_node=self.probe_node,
            code_cache=self.code_cache.for_tenant(job.tenant),
        )

    def _start_controller(self, ctl: JobController) -> None:
        thread = threading.Thread(
            target=self._run_controller, args=(ctl,), name=f"air-job-{ctl.job_id}", daemon=True
        )
        with self._lock:
            self._controllers[ctl.job_id] = ctl
            self._threads[ctl.job_id] = thread
        thread.start()

    def _run_controller(self, ctl: JobController) -> None:
        try:
            while not ctl.finished and not self._stop.is_set():
                ctl.step()
                if not ctl.finished:
                    time.sleep(self.tick_s)
        except Exception as exc:
            log.exception("controller of %s crashed", ctl.job_id)
            try:
                ctl.abort(f"internal error in the runner: {exc}")
            except Exception:
                log.exception("could not fail %s", ctl.job_id)
        finally:
            self._wake.set()  # its slots are free: schedule now

    def _recover(self) -> None:
        """Take over the jobs a previous gateway left active. An attempt whose processes
        still run is adopted and watched as before; one whose processes are gone is
        relaunched as a new attempt, not charged to the job's restart budget."""
        for job in self.store.list_jobs(states=ACTIVE_STATES, limit=10_000):
            attempts = self.store.list_attempts(job.id)
            if job.state is JobState.SCHEDULED or not attempts:
                # placed but never launched: back to the queue, first in line again
                self.store.transition(
                    job.id, JobState.QUEUED, "the gateway restarted before the launch"
                )
                continue
            current = attempts[-1]
            ctl = self._controller(job, current.placement)
            attach = getattr(self.backend, "attach", None)
            handle = (
                attach(
                    job.id,
                    current.attempt,
                    ctl.paths.attempt(current.attempt),
                    job.spec.resources.ranks_per_node,
                )
                if attach is not None and job.state is not JobState.RESTARTING
                else None
            )
            if handle is not None:
                ctl.attach(handle)
                self.store.append_event(
                    job.id,
                    Alert(
                        kind="reattached",
                        detail=f"a restarted gateway re-attached to attempt {current.attempt}",
                    ),
                    attempt=current.attempt,
                )
                log.info("re-attached to %s attempt %s", job.id, current.attempt)
            elif job.state is not JobState.RESTARTING:
                ctl.recover_lost_attempt()
            if not ctl.finished:
                self._start_controller(ctl)
