"""The controller driven step by step with a fake backend whose failures the test triggers."""

from dataclasses import dataclass, field

import pytest

from air_sdk.runner import JobController, JobPaths, RestartPolicy
from air_sdk.runner.backends.base import LaunchRequest, NodeStatus
from air_sdk.runner.policy import FailureAction, diagnose
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import (
    EventType,
    FailureInfo,
    JobSpec,
    JobState,
    NodeAssignment,
    Placement,
    RankExit,
    Resources,
)
from air_sdk.store import SqliteStore


@dataclass
class FakeAttempt:
    job_id: str
    attempt: int
    exit_codes: dict[str, int | None]
    terminated: bool = False
    #: nodes whose machine is gone, which the backend learns only while stopping
    lost_by_teardown: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    #: failure-save marks the ranks left, as the backend reports them, one set per call
    #: (the last repeats)
    marks: list[set[str]] = field(default_factory=list)
    #: exit records a node brings with its status (as a Ray node does), by node
    rank_exits: dict[str, tuple[RankExit, ...]] = field(default_factory=dict)


@dataclass
class FakeBackend:
    name: str = "fake"
    launches: list[LaunchRequest] = field(default_factory=list)
    attempts: list[FakeAttempt] = field(default_factory=list)

    def inventory(self):
        return [NodeSpec("n0", 1), NodeSpec("n1", 1)]

    def launch(self, request):
        self.launches.append(request)
        a = FakeAttempt(
            request.job_id, request.attempt, {n.node: None for n in request.placement.nodes}
        )
        self.attempts.append(a)
        return a

    def poll(self, handle):
        return [
            NodeStatus(n, c, lost=n in handle.lost, rank_exits=handle.rank_exits.get(n, ()))
            for n, c in handle.exit_codes.items()
        ]

    def terminate(self, handle, grace_s, wait_first_s=0.0):
        handle.terminated = True
        handle.lost |= handle.lost_by_teardown
        for n, c in handle.exit_codes.items():
            if c is None:
                handle.exit_codes[n] = -15

    def node_log_tail(self, handle, node, num_lines=20):
        return [f"{node} agent said goodbye"]

    def rank_stacks(self, handle):
        return {0: "Thread 1 (idle)\n    all_reduce (train.py:12)"}

    def failure_marks(self, handle):
        if handle.terminated or not handle.marks:
            return set()
        return handle.marks.pop(0) if len(handle.marks) > 1 else handle.marks[0]


@pytest.fixture
def store(tmp_path):
    return SqliteStore(tmp_path / "air.db")


def make(store, tmp_path, unhealthy=None, **spec_kw):
    spec_kw.setdefault("failure", {"backoff_base_s": 0.0, "backoff_max_s": 0.0})
    spec_kw.setdefault("resources", Resources(nodes=2))
    spec = JobSpec(entrypoint="t.py", **spec_kw)
    job, _ = store.create_job(spec, tenant="default")
    job = store.transition(job.id, JobState.SCHEDULED, "placed")
    placement = Placement(
        job_id=job.id,
        nodes=(NodeAssignment(node="n0", slots=1), NodeAssignment(node="n1", slots=1)),
    )
    backend = FakeBackend()
    ctl = JobController(
        store,
        backend,
        job,
        placement,
        JobPaths(tmp_path / job.id),
        "http://gw",
        prepare_code=False,
        unhealthy_nodes=unhealthy,
    )
    return ctl, backend


def rank_up(store, ctl, rank):
    store.append_worker_events(ctl.job_id, ctl.attempt, rank, [], None)


def rank_exit(store, ctl, rank, code=None, sig=None, tail=(), node=None):
    e = RankExit(rank=rank, node=node, exit_code=code, signal=sig, tail=list(tail))
    store.append_worker_events(ctl.job_id, ctl.attempt, rank, [e], None)


def test_happy_path_state_after_every_step(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    assert ctl.step() == (JobState.SCHEDULED, JobState.STARTING)
    env = backend.launches[0].env
    assert env["AIR_JOB_ID"] == ctl.job_id and env["AIR_ATTEMPT"] == "1" and env["AIR_JOB_TOKEN"]
    assert ctl.step() == (JobState.STARTING, JobState.STARTING)  # nobody reported yet
    rank_up(store, ctl, 0)
    rank_up(store, ctl, 1)
    assert ctl.step() == (JobState.STARTING, JobState.RUNNING)
    backend.attempts[0].exit_codes.update(n0=0)
    assert ctl.step() == (JobState.RUNNING, JobState.RUNNING)  # one node still running
    backend.attempts[0].exit_codes.update(n1=0)
    assert ctl.step() == (JobState.RUNNING, JobState.SUCCEEDED)
    assert ctl.done and store.get_job(ctl.job_id).state is JobState.SUCCEEDED
    assert store.list_attempts(ctl.job_id)[0].reason == "succeeded"


@pytest.mark.parametrize("brought", [True, False])
def test_a_crash_whose_report_is_late_is_a_crash_when_the_node_brings_its_record(
    store, tmp_path, brought
):
    # A Ray node's verdict can reach the runner before the rank's own report of its exit:
    # with the record in the node's status, a crash; with nothing of the rank at all,
    # all there is to blame is the node
    ctl, backend = make(store, tmp_path)
    ctl.step()
    killed = RankExit(rank=1, node="n1", exit_code=None, signal="SIGKILL", tail=["step 22"])
    if brought:
        backend.attempts[0].rank_exits["n1"] = (killed,)
    backend.attempts[0].exit_codes.update(n1=137)
    ctl.step()
    failure = store.get_job(ctl.job_id).failure
    if brought:
        assert (failure.kind, failure.rank, failure.signal) == ("crash", 1, "SIGKILL")
        assert failure.log_tail == ["step 22"]
    else:
        assert (failure.kind, failure.node) == ("lost_node", "n1")


def test_crash_fails_with_rank_code_and_tail(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    ctl.step()
    rank_exit(store, ctl, 1, code=3, tail=["Traceback", "ValueError: bad batch"])
    backend.attempts[0].exit_codes.update(n1=1)
    assert ctl.step() == (JobState.STARTING, JobState.FAILED)
    assert backend.attempts[0].terminated  # the surviving node was stopped
    failure = store.get_job(ctl.job_id).failure
    assert (failure.rank, failure.exit_code) == (1, 3)
    assert failure.log_tail[-1] == "ValueError: bad batch"
    assert "max_restarts is 0" in store.get_job(ctl.job_id).state_reason


def test_restart_budget_then_clear_reason(store, tmp_path):
    ctl, backend = make(store, tmp_path, max_restarts=1)
    ctl.step()
    rank_exit(store, ctl, 0, sig="SIGKILL")
    backend.attempts[0].exit_codes.update(n0=1)
    assert ctl.step() == (JobState.STARTING, JobState.RESTARTING)
    assert ctl.step() == (JobState.RESTARTING, JobState.STARTING)
    assert backend.launches[1].attempt == 2
    rank_exit(store, ctl, 0, sig="SIGKILL")
    backend.attempts[1].exit_codes.update(n0=1)
    assert ctl.step() == (JobState.STARTING, JobState.FAILED)
    job = store.get_job(ctl.job_id)
    assert job.num_restarts == 1 and job.attempt == 2
    assert "raise --max-restarts" in job.state_reason
    assert [a.attempt for a in store.list_attempts(ctl.job_id)] == [1, 2]


def test_lost_node_without_rank_exit(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    ctl.step()
    backend.attempts[0].exit_codes.update(n1=-9)
    ctl.step()
    failure = store.get_job(ctl.job_id).failure
    assert failure.reason.startswith("node n1 lost")
    assert failure.log_tail == ["n1 agent said goodbye"]


def test_a_machine_that_left_is_the_cause_even_when_its_peers_crash_first(store, tmp_path):
    # n1's machine vanished: the rank on n0 lost its peer and crashed, and that crash
    # reached the runner before the cluster noticed n1 was gone (the teardown did).
    ctl, backend = make(store, tmp_path, max_restarts=1)
    ctl.step()
    rank_exit(store, ctl, 0, code=1, node="n0", tail=["RuntimeError: Connection closed by peer"])
    backend.attempts[0].exit_codes.update(n0=1)
    backend.attempts[0].lost_by_teardown = {"n1"}
    ctl.step()
    failure = store.list_attempts(ctl.job_id)[0].failure
    assert failure.kind == "lost_node" and failure.node == "n1"
    assert failure.reason.startswith("node n1 lost")


def test_the_teardown_waits_for_a_survivor_saving_a_checkpoint_at_the_failure(store, tmp_path):
    # the marks come from the backend: on Ray they live on each node, not on this host
    ctl, backend = make(store, tmp_path, max_restarts=1)
    ctl.step()
    attempt = backend.attempts[0]
    saving = {"armed-rank-0", "armed-rank-1", "rank-0"}
    attempt.marks = [saving] * 5 + [saving | {"done-rank-0"}]
    rank_exit(store, ctl, 1, sig="SIGKILL", node="n1")
    attempt.exit_codes.update(n1=1)
    ctl.step()
    assert attempt.terminated
    assert attempt.marks == [saving | {"done-rank-0"}]  # asked until rank 0 was done


def test_diagnose_names_a_machine_that_left_before_the_crashes_it_caused():
    victim = RankExit(rank=0, node="n0", exit_code=1, tail=["Connection closed by peer"])
    gone = NodeStatus("n1", -9, "Ray node 1234 (10.0.0.2) left the cluster", lost=True)
    info = diagnose(1, [(1.0, victim)], [victim], [NodeStatus("n0", 1), gone], {})
    assert (info.kind, info.node) == ("lost_node", "n1")
    assert info.reason == "node n1 lost: Ray node 1234 (10.0.0.2) left the cluster"
    # an agent that merely exited badly does not outrank the rank that crashed
    info = diagnose(1, [(1.0, victim)], [victim], [NodeStatus("n1", -9, "agent killed")], {})
    assert (info.kind, info.rank) == ("crash", 0)


def test_cancel_stops_processes_then_cancels(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    ctl.step()
    store.request_cancel(ctl.job_id)
    assert ctl.step() == (JobState.STARTING, JobState.CANCELLED)
    assert backend.attempts[0].terminated


def test_policy_decisions():
    f = FailureInfo(attempt=1, reason="rank 0 exit code 1")
    assert RestartPolicy(2).make_decision(f, num_restarts=1).action is FailureAction.RESTART
    assert RestartPolicy(2).make_decision(f, num_restarts=2).action is FailureAction.FAIL


def test_diagnose_blames_the_first_rank_to_fail_not_its_victims():
    first = RankExit(rank=1, exit_code=7, tail=["boom"])
    victim = RankExit(rank=0, exit_code=1, tail=["Connection closed by peer"])
    info = diagnose(1, [(2.0, victim), (1.0, first)], [first, victim], [], {})
    assert info.rank == 1 and info.exit_code == 7 and info.log_tail == ["boom"]


def progress(store, ctl, rank, step, ts):
    """A training-loop report from `rank` at `step`, stamped at wall time `ts`."""
    import time as _time

    real = _time.time
    try:
        _time.time = lambda: ts
        store.append_worker_events(ctl.job_id, ctl.attempt, rank, [], step, progress=True)
    finally:
        _time.time = real


def test_hang_names_the_stalled_rank_with_stacks(store, tmp_path):
    import time

    ctl, backend = make(store, tmp_path, failure={"hang_timeout_s": 5, "backoff_base_s": 0})
    ctl.step()
    now = time.time()
    progress(store, ctl, 0, 10, now)
    progress(store, ctl, 1, 7, now - 30)  # rank 1 stopped 30 s ago
    assert ctl.step() == (JobState.STARTING, JobState.RUNNING)
    ctl._next_progress_check = 0
    assert ctl.step() == (JobState.RUNNING, JobState.FAILED)
    failure = store.get_job(ctl.job_id).failure
    assert failure.kind == "hang" and failure.stalled_ranks == [1]
    assert "rank 1 (last step 7)" in failure.reason and "hang_timeout_s" in failure.reason
    assert "all_reduce" in failure.stacks[0]
    assert backend.attempts[0].terminated


def test_a_rank_that_shut_down_is_leaving_not_hung_for_the_exit_grace(store, tmp_path):
    import time

    from air_sdk.runner.controller import EXIT_AFTER_FINISH_S

    ctl, backend = make(store, tmp_path, failure={"hang_timeout_s": 5, "backoff_base_s": 0})
    ctl.step()
    now = time.time()
    progress(store, ctl, 0, 40, now - 30)  # its last step: 30 s ago, then air.shutdown()
    progress(store, ctl, 1, 40, now - 30)
    for rank in (0, 1):  # the ranks' runtimes shut down; their interpreters still exit
        store.append_worker_events(ctl.job_id, ctl.attempt, rank, [], None, finished=True)
    assert set(store.finished_ranks(ctl.job_id, ctl.attempt)) == {0, 1}
    assert ctl.step() == (JobState.STARTING, JobState.RUNNING)
    ctl._next_progress_check = 0
    assert ctl.step() == (JobState.RUNNING, JobState.RUNNING)  # not a hang
    # ...until a rank takes longer than the exit grace to leave
    real = time.time
    try:
        time.time = lambda: real() + EXIT_AFTER_FINISH_S + 1
        ctl._next_progress_check = 0
        assert ctl.step() == (JobState.RUNNING, JobState.FAILED)
    finally:
        time.time = real
    assert store.get_job(ctl.job_id).failure.kind == "hang"


def test_a_gpu_hang_names_the_rank_behind_from_the_flight_recorder(store, tmp_path):
    import pickle
    import time

    gpus = Resources(nodes=2, gpus_per_node=1)
    ctl, backend = make(store, tmp_path, resources=gpus, failure={"hang_timeout_s": 5})
    ctl.step()
    assert backend.launches[0].env["AIR_FLIGHT_RECORDER"] == "1"
    # what torch's flight recorder left in the attempt (here: NCCL's own timeout dumps)
    traces = ctl.paths.attempt(ctl.attempt) / "flight-recorder"
    traces.mkdir(parents=True)

    def entry(seq, state):
        return {
            "process_group": ("0", "default_pg"),
            "collective_seq_id": seq,
            "profiling_name": "nccl:all_reduce",
            "input_sizes": [[1024]],
            "state": state,
        }

    (traces / "rank_0").write_bytes(pickle.dumps({"entries": [entry(8, "completed")]}))
    (traces / "rank_1").write_bytes(
        pickle.dumps({"entries": [entry(8, "completed"), entry(9, "started")]})
    )
    now = time.time()
    progress(store, ctl, 0, 7, now - 30)
    progress(store, ctl, 1, 7, now - 30)
    ctl.step()
    ctl._next_progress_check = 0
    assert ctl.step()[1] is JobState.FAILED
    failure = store.get_job(ctl.job_id).failure
    assert failure.kind == "hang" and failure.rank == 0
    assert failure.reason.endswith(
        "hang_timeout_s); flight recorder: rank 0 is behind in process group 0 (default_pg):"
        " rank 1 waits in all_reduce #9 ([1024]); rank 0 last called all_reduce #8 (completed)"
    )
    assert failure.collectives[1][-1].startswith("all_reduce #9 in process group 0")


def test_the_launch_env_carries_the_models_flops_and_no_recorder_on_cpu(store, tmp_path):
    ctl, backend = make(store, tmp_path, model={"preset": "gpt2-124m"})
    ctl.step()
    env = backend.launches[0].env
    assert float(env["AIR_FLOPS_PER_TOKEN"]) == pytest.approx(855_383_040)
    assert "AIR_FLIGHT_RECORDER" not in env


def supervisor_report(store, ctl, rank, ts, *, active):
    """A report of `rank`'s NodeRunner at wall time `ts`: an output line or CPU use
    (`active`), or only a device sample (not a sign of the rank's own life)."""
    import time as _time

    real = _time.time
    try:
        _time.time = lambda: ts
        store.append_worker_events(ctl.job_id, ctl.attempt, rank, [], None, active=active)
    finally:
        _time.time = real


def test_a_plain_script_silent_and_idle_for_the_timeout_is_hung(store, tmp_path):
    import time

    ctl, backend = make(store, tmp_path, failure={"hang_timeout_s": 5})
    ctl.step()
    now = time.time()
    supervisor_report(store, ctl, 0, now - 30, active=False)  # first report: the rank is up
    supervisor_report(store, ctl, 1, now - 30, active=False)
    supervisor_report(store, ctl, 0, now - 1, active=False)  # a device sample, nothing else
    assert ctl.step() == (JobState.STARTING, JobState.RUNNING)
    ctl._next_progress_check = 0
    assert ctl.step() == (JobState.RUNNING, JobState.FAILED)
    failure = store.get_job(ctl.job_id).failure
    assert failure.kind == "hang" and failure.stalled_ranks == [0, 1]
    assert failure.reason.startswith(
        "no air.log step, no output and no CPU/GPU use from ranks 0, 1 for 5 s (hang_timeout_s)"
    )
    assert backend.attempts[0].terminated


def test_one_busy_rank_keeps_a_plain_script_alive(store, tmp_path):
    import time

    ctl, backend = make(store, tmp_path, failure={"hang_timeout_s": 5})
    ctl.step()
    now = time.time()
    supervisor_report(store, ctl, 0, now - 30, active=False)  # waits in a collective
    supervisor_report(store, ctl, 1, now - 30, active=False)
    supervisor_report(store, ctl, 1, now - 1, active=True)  # computes (CPU) or prints
    ctl.step()
    ctl._next_progress_check = 0
    assert ctl.step()[1] is JobState.RUNNING
    assert not backend.attempts[0].terminated


def test_plain_ranks_get_the_longer_default_when_no_timeout_is_set(store, tmp_path):
    import time

    ctl, backend = make(store, tmp_path)
    ctl.step()
    now = time.time()
    for rank in (0, 1):
        supervisor_report(store, ctl, rank, now - 120, active=False)
    ctl.step()
    ctl._next_progress_check = 0
    assert ctl.step()[1] is JobState.RUNNING  # 120 s of silence: under 300 s


def test_preemption_restarts_without_charging_the_budget(store, tmp_path):
    ctl, backend = make(store, tmp_path, max_restarts=0)
    ctl.step()
    rank_exit(store, ctl, 0, sig="SIGTERM")
    backend.attempts[0].exit_codes.update(n0=1)
    assert ctl.step() == (JobState.STARTING, JobState.RESTARTING)
    assert "not charged" in store.get_job(ctl.job_id).state_reason
    assert ctl.step() == (JobState.RESTARTING, JobState.STARTING)
    job = store.get_job(ctl.job_id)
    assert (job.num_restarts, job.charged_restarts, job.attempt) == (1, 0, 2)


def test_non_retryable_exit_code_fails_at_once(store, tmp_path):
    ctl, backend = make(store, tmp_path, max_restarts=5, failure={"non_retryable_exit_codes": [42]})
    ctl.step()
    rank_exit(store, ctl, 1, code=42)
    backend.attempts[0].exit_codes.update(n1=1)
    assert ctl.step()[1] is JobState.FAILED
    assert "declared non-retryable" in store.get_job(ctl.job_id).state_reason


def test_non_retryable_log_pattern_fails_at_once(store, tmp_path):
    ctl, backend = make(
        store,
        tmp_path,
        max_restarts=5,
        failure={"non_retryable_patterns": [r"CUDA error: .*illegal"]},
    )
    ctl.step()
    rank_exit(store, ctl, 1, code=1, tail=["RuntimeError: CUDA error: an illegal memory access"])
    backend.attempts[0].exit_codes.update(n1=1)
    assert ctl.step()[1] is JobState.FAILED
    assert "non-retryable pattern" in store.get_job(ctl.job_id).state_reason


def test_a_failing_node_is_blamed_and_the_job_requeued_without_it(store, tmp_path):
    from air_sdk.runner.policy import NodeHealthPolicy

    policy = NodeHealthPolicy(min_jobs=1)
    ctl, backend = make(
        store,
        tmp_path,
        max_restarts=3,
        unhealthy=lambda: policy.unhealthy(
            ctl._node_book.evidence(), __import__("time").time(), num_tenants=1
        ),
    )
    ctl.step()
    rank_exit(store, ctl, 1, sig="SIGBUS", node="n1")
    backend.attempts[0].exit_codes.update(n1=1)
    assert ctl.step() == (JobState.STARTING, JobState.QUEUED)
    assert ctl.released and not ctl.done
    assert store.node_failures()["n1"][0] == 1
    assert "unhealthy node n1" in store.get_job(ctl.job_id).state_reason


def test_cancel_during_backoff_ends_the_job_for_good(store, tmp_path):
    import threading

    ctl, backend = make(
        store, tmp_path, max_restarts=3, failure={"backoff_base_s": 30, "backoff_max_s": 30}
    )
    ctl.step()
    rank_exit(store, ctl, 0, code=1)
    backend.attempts[0].exit_codes.update(n0=1)
    threading.Timer(0.3, store.request_cancel, args=(ctl.job_id,)).start()
    assert ctl.step() == (JobState.STARTING, JobState.CANCELLED)
    assert len(backend.launches) == 1  # never relaunched


def test_backoff_grows_with_full_jitter_and_caps():
    import random

    from air_sdk.schema import FailurePolicySpec

    p = RestartPolicy(3, FailurePolicySpec(backoff_base_s=1, backoff_max_s=8), random.Random(0))
    for n, cap in [(0, 1), (1, 2), (2, 4), (3, 8), (6, 8)]:
        delays = [p.backoff_s(n) for _ in range(50)]
        assert all(cap / 2 <= d <= cap for d in delays)


def test_lost_attempt_after_gateway_restart_is_judged_by_exit_records(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    ctl.step()
    rank_exit(store, ctl, 0, code=0)
    rank_exit(store, ctl, 1, code=0)
    ctl.handle = None  # the processes ended while no gateway watched
    ctl.recover_lost_attempt()
    assert store.get_job(ctl.job_id).state is JobState.SUCCEEDED

    ctl2, _ = make(store, tmp_path)
    ctl2.step()
    ctl2.handle = None
    ctl2.recover_lost_attempt()  # nothing recorded: relaunch, not charged
    job = store.get_job(ctl2.job_id)
    assert job.state is JobState.RESTARTING and job.charged_restarts == 0


def test_stragglers_are_reported_once_not_killed():
    from air_sdk.runner.policy import RankProgress, StragglerPolicy

    ranks = {r: RankProgress(intervals=[1.0] * 20) for r in range(3)}
    ranks[3] = RankProgress(intervals=[5.0] * 20)
    assert StragglerPolicy().stragglers(ranks) == [3]
    assert StragglerPolicy().stragglers({0: RankProgress(intervals=[1.0] * 3)}) == []


def test_an_exit_code_never_blames_the_node(store, tmp_path):
    ctl, backend = make(store, tmp_path, max_restarts=1)
    ctl.step()
    rank_exit(store, ctl, 1, code=1, node="n1")
    backend.attempts[0].exit_codes.update(n1=1)
    ctl.step()
    assert store.node_failures() == {}


def test_the_rank_that_died_first_is_blamed_even_if_its_record_came_later(store, tmp_path):
    ctl, backend = make(store, tmp_path, max_restarts=0)
    ctl.step()
    # rank 0's record (a victim: its peer vanished) arrives first, but rank 1 ended first
    victim = RankExit(rank=0, exit_code=1, ended_at=20.0, tail=["Connection closed by peer"])
    first = RankExit(rank=1, signal="SIGTERM", ended_at=10.0)
    for e in (victim, first):
        store.append_worker_events(ctl.job_id, ctl.attempt, e.rank, [e], None)
    backend.attempts[0].exit_codes.update(n0=1)
    assert ctl.step() == (JobState.STARTING, JobState.RESTARTING)
    failure = store.get_job(ctl.job_id).failure
    assert (failure.rank, failure.kind) == (1, "preempted")


def test_scheduler_preemption_stops_gracefully_and_requeues_uncharged(store, tmp_path):
    ctl, backend = make(store, tmp_path, max_restarts=0, failure={"preemption_grace_s": 7})
    graces = []
    terminate = backend.terminate
    backend.terminate = lambda h, grace_s, wait_first_s=0.0: (
        graces.append(grace_s),
        terminate(h, grace_s, wait_first_s),
    )
    ctl.step()
    rank_up(store, ctl, 0)
    rank_up(store, ctl, 1)
    ctl.step()
    assert ctl.state is JobState.RUNNING
    assert ctl.preempt("preempted for high-priority job hi-1") is True
    assert ctl.stopping and ctl.preempt("again") is False  # one preemption at a time
    ctl.step()
    job = store.get_job(ctl.job_id)
    assert job.state is JobState.QUEUED and ctl.released and ctl.finished
    assert "hi-1" in job.state_reason
    assert (job.num_restarts, job.charged_restarts) == (1, 0)
    assert graces == [7]  # the job's own grace to checkpoint, not the failure teardown's
    attempt = store.list_attempts(ctl.job_id)[0]
    assert attempt.failure.kind == "preempted" and not attempt.failure.charged
    states = [e.data["state"] for e in store.read_events(ctl.job_id, types=(EventType.STATE,))]
    assert states[-2:] == ["RESTARTING", "QUEUED"]


def test_preemption_before_launch_just_requeues(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    assert ctl.preempt("room needed") is True
    ctl.step()
    assert store.get_job(ctl.job_id).state is JobState.QUEUED
    assert backend.launches == [] and store.list_attempts(ctl.job_id) == []


def test_cancel_during_the_preemption_grace_ends_the_job(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    ctl.step()
    terminate = backend.terminate

    def cancel_while_stopping(h, grace_s, wait_first_s=0.0):
        store.request_cancel(ctl.job_id)
        terminate(h, grace_s, wait_first_s)

    backend.terminate = cancel_while_stopping
    ctl.preempt("room needed")
    ctl.step()
    assert store.get_job(ctl.job_id).state is JobState.CANCELLED and ctl.done


def test_a_module_job_gets_its_code_linked_from_the_cache_and_runs_python_m(store, tmp_path):
    from air_sdk.bundle import pack_directory
    from air_sdk.bundle.cache import BundleCache
    from air_sdk.runner.node.launch import program_argv

    bundle = pack_directory(tmp_path, extra_files={"pkg/__init__.py": b"", "pkg/train.py": b"x=1"})
    archive = tmp_path / "bundle.tar.gz"
    archive.write_bytes(bundle.data)
    store.add_bundle("default", bundle.sha256, len(bundle.data), 2, str(archive))
    spec = JobSpec(module="pkg.train", bundle_sha256=bundle.sha256, args=["--epochs", "3"])
    job, _ = store.create_job(spec, tenant="default")
    job = store.transition(job.id, JobState.SCHEDULED, "placed")
    placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    backend = FakeBackend()
    cache = BundleCache(tmp_path / "code-cache")
    paths = JobPaths(tmp_path / "jobs" / job.id)
    ctl = JobController(store, backend, job, placement, paths, "http://gw", code_cache=cache)
    assert ctl.step() == (JobState.SCHEDULED, JobState.STARTING)
    (request,) = backend.launches
    assert request.entrypoint == "-m pkg.train"
    assert program_argv(request.entrypoint) == ["-m", "pkg.train"]
    linked = paths.code / "pkg" / "train.py"
    assert linked.stat().st_ino == (cache.tree(bundle.sha256) / "pkg" / "train.py").stat().st_ino
