"""One controller per job: the job state machine, carried out.

`step()` does one bounded iteration and returns (previous, next) state, so tests
can drive it with a fake backend and assert the state after every iteration.
Decisions come from policy objects (`RestartPolicy`, `HangPolicy`,
`StragglerPolicy`, `diagnose`); the controller only acts on them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.base import AttemptHandle, Backend, LaunchRequest, NodeStatus
from air_sdk.runner.data_waits import hang_notes, straggler_note
from air_sdk.runner.failure_saves import wait_for_failure_saves
from air_sdk.runner.flight_recorder import hang_report
from air_sdk.runner.job_files import JobPaths, entrypoint_of, prepare_code
from air_sdk.runner.node.plan import attempt_worker
from air_sdk.runner.node.records import rank_exits
from air_sdk.runner.node_health import NodeHealthBook
from air_sdk.runner.policy import (
    FailureAction,
    FailureDecision,
    HangPolicy,
    RankProgress,
    RestartPolicy,
    StragglerPolicy,
    diagnose,
    last_seen_by_node,
    node_evidence,
)
from air_sdk.runner.stopping import stop_unless_cancelled
from air_sdk.scheduler.tenancy import TenantCrashes
from air_sdk.schema import (
    EventType,
    FailureInfo,
    JobRecord,
    JobState,
    Placement,
    RankExit,
)
from air_sdk.schema.events import Alert, FailureKind
from air_sdk.store import SqliteStore

if TYPE_CHECKING:
    from air_sdk.bundle.cache import BundleCache

log = logging.getLogger(__name__)

#: the cap on a job's preemption grace when the runner is given none (GatewayOptions)
DEFAULT_MAX_PREEMPTION_GRACE_S = 120.0
#: after every rank exited 0, how long launchers get to leave on their own
SUCCESS_EXIT_WAIT_S = 5.0
#: how long a rank whose runtime shut down (air.shutdown) may take to exit before the
#: hang timeout applies to it again (freeing a large model's memory on a loaded machine)
EXIT_AFTER_FINISH_S = 120.0
#: SIGTERM-to-SIGKILL grace when an attempt already failed (cancel gets the full grace)
FAILURE_TEARDOWN_GRACE_S = 0.5
#: how often the (cheap) progress checks run
PROGRESS_CHECK_S = 0.5


class JobController:
    """Runs one job from SCHEDULED (or a re-attached attempt) to a terminal state.

    Example (see tests/unit/runner for a fake backend):
        >>> ctl = JobController(store, backend, job, placement, paths, gateway_url)  # doctest: +SKIP
        >>> while not ctl.finished:
        ...     ctl.step()  # doctest: +SKIP
    """

    def __init__(
        self,
        store: SqliteStore,
        backend: Backend,
        job: JobRecord,
        placement: Placement,
        paths: JobPaths,
        gateway_url: str,
        *,
        prepare_code: bool = True,
        teardown_grace_s: float = 5.0,
        unhealthy_nodes: Callable[[], set[str]] | None = None,
        node_book: NodeHealthBook | None = None,
        restart_policy: RestartPolicy | None = None,
        code_cache: BundleCache | None = None,
        max_preemption_grace_s: float = DEFAULT_MAX_PREEMPTION_GRACE_S,
        tenant_crashes: Callable[[str], TenantCrashes] | None = None,
        probe_node: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.job_id = job.id
        self.tenant = job.tenant
        self.spec = job.spec
        self.placement = placement
        self.paths = paths
        self.gateway_url = gateway_url
        self.policy = restart_policy or RestartPolicy(
            max_restarts=job.spec.max_restarts, spec=job.spec.failure
        )
        self.hang_policy = HangPolicy(timeout_s=job.spec.failure.hang_timeout_s)
        self.straggler_policy = StragglerPolicy()
        self.teardown_grace_s = teardown_grace_s
        self.max_preemption_grace_s = max_preemption_grace_s
        self.state = job.state
        self.charged_restarts = job.charged_restarts
        self.handle: AttemptHandle | None = None
        self.attempt = job.attempt
        self.attempt_started = 0.0
        self.job_started = time.monotonic()
        #: wall time this controller took the placement (the scheduler's start time)
        self.scheduled_at = time.time()
        #: set by the runner (another thread) when the scheduler preempts this job
        self._preempt_reason: str | None = None
        #: set when the job went back to the queue (e.g. a node of its placement became
        #: unhealthy): this controller is done, a new one will run the next placement
        self.released = False
        self._unhealthy_nodes = unhealthy_nodes or (lambda: set())
        #: where failures that may be a node's fault are kept (the runner's, shared)
        self._node_book = node_book or NodeHealthBook()
        #: the tenant's charged failures over the last hour against its restart allowance
        self._tenant_crashes = tenant_crashes or (lambda t: TenantCrashes(t, 0, None))
        #: runs the operator's node health probe on a node a failure names
        self._probe_node = probe_node or (lambda node: None)
        self._prepare_code = prepare_code
        #: bundles unpacked once per sha256; the job's code dir links their files
        self._code_cache = code_cache
        self._code_ready = False
        self._progress: dict[int, RankProgress] = {}
        self._reported_stragglers: set[int] = set()
        self._next_progress_check = 0.0

    @property
    def done(self) -> bool:
        return self.state.terminal

    @property
    def finished(self) -> bool:
        """Nothing left for this controller to do (the job ended or was requeued)."""
        return self.done or self.released

    @property
    def stopping(self) -> bool:
        """A preemption of this job is in flight: its placement is about to be free."""
        return self._preempt_reason is not None

    def preempt(self, reason: str) -> bool:
        """Ask (from any thread) for this job to be preempted: its ranks get SIGTERM and
        `failure.preemption_grace_s` to save a checkpoint, then it goes back to the
        queue, not charged to its restart budget. False if it is ending anyway."""
        if self.finished or self._preempt_reason is not None:
            return False
        self._preempt_reason = reason
        return True

    # -- the loop ------------------------------------------------------------------------

    def step(self) -> tuple[JobState, JobState]:
        previous = self.state
        job = self.store.get_job(self.job_id)
        assert job is not None
        if job.state.terminal:  # ended elsewhere (e.g. an admin); make sure nothing runs
            self._teardown()
            self._release_backend()
            self.state = job.state
            return previous, self.state
        if job.cancel_requested:
            self._cancel()
            return previous, self.state
        if self._preempt_reason is not None:
            self._preempt(self._preempt_reason)
            return previous, self.state
        if self.state in (JobState.SCHEDULED, JobState.RESTARTING):
            self._launch()
        elif self.state in (JobState.STARTING, JobState.RUNNING):
            self._watch()
        return previous, self.state

    def attach(self, handle: AttemptHandle) -> None:
        """Adopt an attempt whose processes outlived a previous gateway."""
        self.handle = handle
        self.attempt_started = time.monotonic()

    def recover_lost_attempt(self) -> None:
        """The current attempt's processes are gone and nobody watched them end (the
        gateway was down): judge it by the exit records its supervisors left. Every
        rank exited 0: SUCCEEDED. One failed: the usual failure path. Nothing to go
        by: relaunch, not charged to the restart budget."""
        exits = self._rank_exits()
        if self._all_ok(exits):
            self._end_attempt("succeeded")
            self._move(JobState.SUCCEEDED, "every rank exited 0 (seen after a gateway restart)")
        elif any(not e.ok for _, e in exits.values()):
            failure = diagnose(
                self.attempt, list(exits.values()), [e for _, e in exits.values()], [], {}
            )
            self._fail_or_restart(failure)
        else:
            reason = "the gateway restarted and the job's processes were gone"
            failure = FailureInfo(
                attempt=self.attempt, reason=reason, kind="gateway", charged=False
            )
            self._fail_or_restart(failure)

    def abort(self, reason: str, kind: FailureKind = "internal") -> None:
        """Stop every process of the job and fail it with `reason` (an internal error).
        Safe to call whatever state the controller is in."""
        self._teardown()
        if self.state.terminal:
            return
        failure = FailureInfo(attempt=self.attempt, reason=reason, kind=kind)
        self._end_attempt(reason, failure)
        self._move(JobState.FAILED, reason, failure)

    # -- actions -------------------------------------------------------------------------

    def _move(
        self,
        state: JobState,
        reason: str,
        failure: FailureInfo | None = None,
        *,
        charged: bool = True,
    ) -> None:
        if state.terminal or state is JobState.QUEUED:
            self._release_backend()
        self.store.transition(self.job_id, state, reason, failure=failure, charged=charged)
        self.state = state

    def _release_backend(self) -> None:
        """A backend may keep a stopped attempt's resources for a relaunch on the same
        nodes (Ray keeps its actors and placement group, the local backend its
        NodeRunners with their warm interpreters): none comes now, and the next state
        must not be seen while they still hold the nodes."""
        release = getattr(self.backend, "release", None)
        if release is not None:
            release(self.job_id)

    def _cancel(self) -> None:
        self._teardown()
        self._end_attempt("cancelled by user")
        self._move(JobState.CANCELLED, "cancelled by user")

    def _preempt(self, reason: str) -> None:
        """Stop the attempt gracefully (SIGTERM, the job's preemption grace to save a
        checkpoint, then SIGKILL) and requeue the job with its first submit time."""
        grace = min(self.spec.failure.preemption_grace_s, self.max_preemption_grace_s)
        # A cancel during the grace kills the ranks soon after it came, whatever the grace.
        handle, self.handle = self.handle, None
        if handle is not None:
            stop_unless_cancelled(self.backend, handle, grace, self._cancel_requested)
        if self._cancel_requested():
            self._cancel()
            return
        failure = FailureInfo(attempt=self.attempt, kind="preempted", reason=reason, charged=False)
        if self.state in (JobState.STARTING, JobState.RUNNING):
            self._end_attempt(failure.reason, failure)
            self._move(JobState.RESTARTING, failure.reason, failure, charged=False)
        self._move(JobState.QUEUED, f"{reason}; waiting for a placement again")
        self.released = True

    def _launch(self) -> None:
        try:
            entrypoint = self._ready_code()
        except Exception as exc:  # a bad bundle fails the job, it never retries
            failure = FailureInfo(
                attempt=self.attempt, reason=f"could not prepare the job code: {exc}"
            )
            self._move(JobState.FAILED, failure.reason, failure)
            return
        self.attempt, token = self.store.start_attempt(self.job_id, self.placement)
        self._progress = {}
        self._reported_stragglers = set()
        worker = attempt_worker(
            job_id=self.job_id,
            attempt=self.attempt,
            spec=self.spec,
            gateway_url=self.gateway_url,
            job_token=token,
            checkpoint_dir=self.spec.checkpoint.dir or str(self.paths.checkpoints),
            output_dir=self.spec.output_dir or self.paths.outputs,
        )
        request = LaunchRequest(
            job_id=self.job_id,
            attempt=self.attempt,
            spec=self.spec,
            placement=self.placement,
            code_dir=self.paths.code,
            attempt_dir=self.paths.attempt(self.attempt),
            entrypoint=entrypoint,
            worker=worker,
            tenant=self.tenant,
        )
        self.attempt_started = time.monotonic()
        self._move(
            JobState.STARTING,
            "launching on "  # the attempt number is on the event and beside every reason
            + ", ".join(a.node for a in self.placement.nodes),
        )
        try:
            self.handle = self.backend.launch(request)
        except ConfigError as exc:
            # The backend refuses the job as specified (e.g. a node-local checkpoint dir
            # for a multi-node job on Ray): a retry cannot help, the message says what to change.
            failure = FailureInfo(attempt=self.attempt, reason=str(exc), kind="startup")
            self._end_attempt(failure.reason, failure)
            self._move(JobState.FAILED, failure.reason, failure)

    def _watch(self) -> None:
        assert self.handle is not None
        nodes = self.backend.poll(self.handle)
        exits = self._rank_exits()  # read once per tick: both checks below use it
        if (nodes and all(n.exit_code == 0 for n in nodes)) or self._all_ok(exits):
            # The ranks' work is done; launchers leave their exit barrier on their own
            # within a second or so (a SIGTERM there can hang one on a dead store). The
            # job ends only once nothing of it runs: a terminal state frees its slots.
            self._teardown(wait_first_s=SUCCESS_EXIT_WAIT_S)
            for a in self.placement.nodes:  # a node that just ran a job to the end is fine
                self.store.clear_node_failures(a.node)
                self._node_book.ran_fine(a.node)
            self._end_attempt("succeeded")
            self._move(JobState.SUCCEEDED, "every rank exited 0")
            return
        if any(n.exit_code not in (None, 0) for n in nodes) or any(
            not e.ok for _, e in exits.values()
        ):
            # A rank's supervisor records its death at once; waiting for its launcher to
            # notice and stop its node's other ranks would cost a second or more.
            self._on_failure(nodes)
            return
        if self.state is JobState.STARTING and self._all_ranks_reported():
            self._move(JobState.RUNNING, "every rank is up")
            return
        now = time.monotonic()
        if self.spec.timeout_s is not None and now - self.job_started > self.spec.timeout_s:
            self._teardown()
            failure = FailureInfo(
                attempt=self.attempt,
                kind="timeout",
                reason=f"the job ran past its timeout of {self.spec.timeout_s:g} s: raise timeout_s",
            )
            self._end_attempt(failure.reason, failure)
            self._move(JobState.FAILED, failure.reason, failure)
            return
        if (
            self.state is JobState.STARTING
            and now - self.attempt_started > self.spec.startup_timeout_s
        ):
            failure = FailureInfo(
                attempt=self.attempt,
                kind="startup",
                reason=f"not every rank started within {self.spec.startup_timeout_s:g} s"
                " (startup_timeout_s)",
                log_tail=self._node_tails(self.handle).get(self.placement.nodes[0].node, []),
            )
            self._teardown()
            self._fail_or_restart(failure)
            return
        if now >= self._next_progress_check:
            self._next_progress_check = now + PROGRESS_CHECK_S
            self._check_progress()

    # -- hangs and stragglers ----------------------------------------------------------------

    def _check_progress(self) -> None:
        for rank, (step, _ts, progress_ts) in self.store.heartbeats(
            self.job_id, self.attempt
        ).items():
            self._progress.setdefault(rank, RankProgress()).observe(step, progress_ts)
        for rank, active_ts in self.store.last_active(self.job_id, self.attempt).items():
            self._progress.setdefault(rank, RankProgress()).active_ts = active_ts
        for rank in self._rank_exits():  # a rank that ended is not hung (its peers may be)
            self._progress.pop(rank, None)
        now = time.time()
        for rank, finished_ts in self.store.finished_ranks(self.job_id, self.attempt).items():
            if now - finished_ts < EXIT_AFTER_FINISH_S:  # leaving: its exit takes a while
                self._progress.pop(rank, None)
        stalled = self.hang_policy.stalled(self._progress, now)
        if stalled:
            self._on_hang(stalled)
            return
        silent = self.hang_policy.silent(self._progress, now)
        if silent:
            self._on_hang(silent, silent=True)
            return
        for rank in self.straggler_policy.stragglers(self._progress):
            if rank not in self._reported_stragglers:
                self._reported_stragglers.add(rank)
                self.store.append_event(
                    self.job_id,
                    Alert(
                        kind="straggler",
                        rank=rank,
                        detail=f"rank {rank}'s step time stays above "
                        f"{self.straggler_policy.factor:g}x the other ranks'"
                        + straggler_note(self.store, self.job_id, self.attempt, rank),
                    ),
                    attempt=self.attempt,
                    rank=rank,
                )

    def _on_hang(self, stalled: list[int], *, silent: bool = False) -> None:
        assert self.handle is not None
        detected_at = time.time()
        waits = hang_notes(self.store, self.job_id, self.attempt, stalled)  # "waiting for data"
        if silent:
            timeout = self.hang_policy.silent_timeout()
            what = "no air.log step, no output and no CPU/GPU use from rank" + (
                f"{'s' if len(stalled) > 1 else ''} "
                + ", ".join(f"{r} ({waits[r]})" if r in waits else str(r) for r in stalled)
            )
        else:
            timeout = self.hang_policy.timeout_for(self._progress)
            steps = {r: self._progress[r].step for r in stalled}
            what = f"no progress from rank{'s' if len(stalled) > 1 else ''} " + ", ".join(
                f"{r} (last step {steps[r]}{', ' + waits[r] if r in waits else ''})"
                for r in stalled
            )
        stacks = self.backend.rank_stacks(self.handle)
        # Each rank's last collectives, while the ranks still live to dump them.
        collectives = hang_report(
            self.paths.attempt(self.attempt), num_ranks=self.spec.resources.world_size
        )
        handle = self.handle
        # A stopped or wedged rank cannot act on SIGTERM: waiting the full grace only
        # delays the restart (measured: 5 of the 6.8 s past the timeout).
        self._teardown(grace_s=FAILURE_TEARDOWN_GRACE_S)
        failure = FailureInfo(
            attempt=self.attempt,
            kind="hang",
            reason=f"{what} for {timeout:g} s (hang_timeout_s)"
            + (f"; flight recorder: {collectives.summary}" if collectives else ""),
            rank=(collectives.culprits or stalled)[0] if collectives else stalled[0],
            stalled_ranks=stalled,
            stacks=stacks,
            collectives=collectives.last_collectives if collectives else {},
            log_tail=self._node_tails(handle).get(self.placement.nodes[0].node, [])[-5:],
            failed_at=self.hang_policy.stopped_at(self._progress, stalled, silent=silent),
            detected_at=detected_at,
        )
        self._fail_or_restart(failure)

    # -- failures --------------------------------------------------------------------------

    def _on_failure(self, nodes: list[NodeStatus]) -> None:
        detected_at = time.time()
        before = self._rank_exits(nodes)
        last_seen = last_seen_by_node(
            self.store.heartbeats(self.job_id, self.attempt), self.placement, self.spec.resources
        )
        handle = self.handle
        # Survivors writing a checkpoint at the failure get to finish it; the attempt is
        # lost already otherwise: no grace for a SIGTERM save (a collective that can no
        # longer complete), stop the rest at once.
        assert handle is not None
        world = self.spec.resources.world_size
        wait_for_failure_saves(
            self.backend, handle, world, lambda: set(self._rank_exits()), self.job_id
        )
        self._teardown(grace_s=FAILURE_TEARDOWN_GRACE_S)
        after = self._rank_exits(nodes)
        # A machine that left the cluster may be named only by the teardown (its peers'
        # crashes can reach the runner before the cluster notices the machine is gone).
        lost = {s.node: s for s in self.backend.poll(handle) if s.lost}
        nodes = [lost.get(n.node, n) for n in nodes]
        failure = diagnose(
            self.attempt,
            list(before.values()),
            [e for _, e in after.values()],
            nodes,
            self._node_tails(handle),
            last_seen=last_seen,
            detected_at=detected_at,
        )
        self._fail_or_restart(failure)

    def _fail_or_restart(self, failure: FailureInfo) -> None:
        self._end_attempt(failure.reason, failure)
        evidence = node_evidence(failure, tenant=self.tenant, job_id=self.job_id, now=time.time())
        if evidence is not None:  # the store keeps the count; the book, whose jobs they were
            self.store.record_node_failure(evidence.node)
            self._node_book.add(evidence)
        if failure.node is not None:  # before the restart picks its nodes
            self._probe_node(failure.node)
        decision = self.policy.make_decision(failure, num_restarts=self.charged_restarts)
        if decision.action is FailureAction.RESTART and decision.charged:
            # The tenant pays for its crash loops: past its allowance, no more restarts.
            crashes = self._tenant_crashes(self.tenant)
            refusal, note = crashes.refusal(), crashes.note()
            if refusal is not None:
                decision = FailureDecision(FailureAction.FAIL, f"{failure.reason}; {refusal}")
            elif note is not None:
                decision = dataclasses.replace(decision, reason=f"{decision.reason} ({note})")
        if decision.action is not FailureAction.RESTART:
            self._move(JobState.FAILED, decision.reason, failure)
            return
        if decision.charged:
            self.charged_restarts += 1
        self._move(JobState.RESTARTING, decision.reason, failure, charged=decision.charged)
        if self._sleep_unless_cancelled(decision.delay_s):
            self._cancel()
            return
        placed = {a.node for a in self.placement.nodes}
        # A node the backend no longer offers (a Ray node that left the cluster) is as bad.
        offered = {n.name for n in self.backend.inventory() if n.healthy}
        bad = (self._unhealthy_nodes() & placed) | (placed - offered)
        if bad:
            # Back to the queue: the scheduler places the next attempt without them.
            self._move(
                JobState.QUEUED,
                f"waiting for a placement without unhealthy node{'s' if len(bad) > 1 else ''} "
                + ", ".join(sorted(bad)),
            )
            self.released = True

    def _sleep_unless_cancelled(self, delay_s: float) -> bool:
        deadline = time.monotonic() + delay_s
        while True:
            if self._cancel_requested():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.1, left))

    def _teardown(self, wait_first_s: float = 0.0, grace_s: float | None = None) -> None:
        if self.handle is not None:
            grace = self.teardown_grace_s if grace_s is None else grace_s
            self.backend.terminate(self.handle, grace, wait_first_s=wait_first_s)
            self.handle = None

    def _cancel_requested(self) -> bool:
        job = self.store.get_job(self.job_id)
        return job is not None and job.cancel_requested

    def _end_attempt(self, reason: str, failure: FailureInfo | None = None) -> None:
        if self.attempt:
            self.store.end_attempt(self.job_id, self.attempt, reason, failure)

    # -- reading what workers left -----------------------------------------------------------

    def _all_ok(self, exits: dict[int, tuple[float, RankExit]]) -> bool:
        return len(exits) >= self.spec.resources.world_size and all(e.ok for _, e in exits.values())

    def _all_ranks_reported(self) -> bool:
        return (
            len(self.store.heartbeats(self.job_id, self.attempt)) >= self.spec.resources.world_size
        )

    def _rank_exits(self, nodes: Sequence[NodeStatus] = ()) -> dict[int, tuple[float, RankExit]]:
        """Rank exits of this attempt: the supervisors' files (written even when the
        gateway is unreachable), their events and the records ended `nodes` brought (a
        Ray node's, maybe before its ranks' reports), keyed by rank, with the time seen."""
        exits: dict[int, tuple[float, RankExit]] = {}
        found = [(e, e.ended_at or time.time()) for s in nodes for e in s.rank_exits]
        for ev in self.store.read_events(
            self.job_id, types=(EventType.RANK_EXIT,), attempt=self.attempt, limit=10_000
        ):
            e = ev.payload_as(RankExit)
            exits[e.rank] = (e.ended_at or ev.ts, e)
        # read by fd, links and FIFOs skipped: the job writes this directory
        found += rank_exits(self.paths.exit_records(self.attempt))
        for e, ts in found:
            if e.rank not in exits or ts < exits[e.rank][0]:
                exits[e.rank] = (ts, e)
        return exits

    def _node_tails(self, handle: AttemptHandle | None) -> dict[str, list[str]]:
        if handle is None:
            return {}
        return {a.node: self.backend.node_log_tail(handle, a.node) for a in self.placement.nodes}

    def _ready_code(self) -> str:
        """Build the job's code dir once (`job_files.prepare_code`); returns the
        entrypoint relative to it (`job_files.entrypoint_of`)."""
        if self._prepare_code and not self._code_ready:
            bundle = None
            if self.spec.bundle_sha256:
                row = self.store.get_bundle(self.tenant, self.spec.bundle_sha256)
                if row is None:
                    raise FileNotFoundError(
                        f"bundle {self.spec.bundle_sha256} is not on the gateway"
                    )
                bundle = Path(row["path"])
            prepare_code(self.paths, self.spec, bundle, self._code_cache)
            self._code_ready = True
        return entrypoint_of(self.spec, self.paths if self._prepare_code else None)
