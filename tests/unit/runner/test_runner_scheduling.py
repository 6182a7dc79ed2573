"""The runner carries out the scheduler's decisions: priorities, quotas, preemption and
the reasons queued jobs wait. Real store, real controller threads, a fake backend
whose ranks run until stopped."""

from __future__ import annotations

import threading

import pytest
from airtest import wait_for

from air_sdk.runner import Runner
from air_sdk.runner.backends.base import NodeStatus
from air_sdk.runner.devices import local_virtual_nodes
from air_sdk.scheduler import NodeSpec, SchedulerPolicy, TenantQuota
from air_sdk.schema import Alert, EventType, JobSpec, JobState, Resources
from air_sdk.store import SqliteStore


class RunsUntilStopped:
    """Two 1-slot nodes; every launched attempt runs until terminated."""

    name = "fake"

    def __init__(self) -> None:
        self.launched: list[str] = []
        self.graces: dict[str, float] = {}
        self._lock = threading.Lock()

    def inventory(self):
        return [NodeSpec("n0", 1), NodeSpec("n1", 1)]

    def launch(self, request):
        with self._lock:
            self.launched.append(request.job_id)
        return {"job": request.job_id, "nodes": [a.node for a in request.placement.nodes]}

    def poll(self, handle):
        return [NodeStatus(n, None) for n in handle["nodes"]]

    def terminate(self, handle, grace_s, wait_first_s=0.0):
        self.graces[handle["job"]] = grace_s

    def rank_stacks(self, handle):
        return {}

    def failure_marks(self, handle):
        return set()

    def node_log_tail(self, handle, node, num_lines=20):
        return []


class TwoCoreLaptop(RunsUntilStopped):
    """The local backend's default on a 2-core machine: 2 virtual nodes of 2 slots each
    that share the 2 cores (or, oversubscribed, do not)."""

    def __init__(self, oversubscribe: bool = False) -> None:
        super().__init__()
        self.nodes = local_virtual_nodes(2, gpus=[], cores=2, oversubscribe=oversubscribe)

    def inventory(self):
        return self.nodes


@pytest.fixture
def runner(tmp_path):
    runners = []

    def make(policy=None, backend=None):
        r = Runner(
            SqliteStore(tmp_path / "air.db"),
            backend or RunsUntilStopped(),
            tmp_path,
            "http://127.0.0.1:1",
            tick_s=0.02,
            policy=policy,
        )
        runners.append(r)
        return r

    yield make
    for r in runners:
        r.stop(timeout_s=5)


def submit(runner, *, nodes=2, procs=1, priority="normal", tenant="default", **spec):
    resources = Resources(nodes=nodes, procs_per_node=procs)
    job, _ = runner.store.create_job(
        JobSpec(code="pass", resources=resources, priority=priority, **spec),
        tenant=tenant,
    )
    return job.id


def state(runner, job_id):
    return runner.store.get_job(job_id).state


def test_high_priority_starts_first_and_the_other_is_told_why(runner):
    r = runner()
    low = submit(r, priority="low")
    high = submit(r, priority="high")
    assert r.schedule_once() == [high]
    reason, position = r.queue_info(low)
    assert position == 1
    assert reason is not None and "2 nodes" in reason


def test_a_high_priority_job_preempts_a_running_low_one(runner):
    r = runner()
    low = submit(r, priority="low", failure={"preemption_grace_s": 12})
    assert r.schedule_once() == [low]
    wait_for(lambda: state(r, low) is JobState.STARTING, 10, "low launched")
    high = submit(r, priority="high")
    assert r.schedule_once() == []  # the room is being made
    wait_for(lambda: state(r, low) is JobState.QUEUED, 10, "low requeued")
    assert r.backend.graces[low] == 12
    record = r.store.get_job(low)
    assert f"preempted for high-priority job {high}" in record.state_reason
    assert (record.num_restarts, record.charged_restarts) == (1, 0)
    assert r.store.list_attempts(low)[0].failure.kind == "preempted"
    wait_for(lambda: high in r.schedule_once() or state(r, high) is not JobState.QUEUED, 10, "high")
    wait_for(lambda: state(r, high) is JobState.STARTING, 10, "high launched")
    r.schedule_once()
    reason, position = r.queue_info(low)
    assert position == 1 and reason  # waits, first in line, with a reason


def test_quota_holds_a_tenant_back_but_not_another(runner):
    policy = SchedulerPolicy(quotas={"vision": TenantQuota(slots=1)})
    r = runner(policy)
    first = submit(r, nodes=1, tenant="vision")
    second = submit(r, nodes=1, tenant="vision")
    other = submit(r, nodes=1, tenant="nlp")
    started = r.schedule_once()
    assert sorted(started) == sorted([first, other])
    reason, position = r.queue_info(second)
    assert reason is not None and reason.startswith("over quota: tenant 'vision'")
    assert position is None  # an over-quota job holds no place in line


def test_a_job_that_can_never_fit_fails_with_the_reason(runner):
    r = runner()
    big = submit(r, nodes=3)
    r.schedule_once()
    record = r.store.get_job(big)
    assert record.state is JobState.FAILED
    assert "needs 3 nodes" in record.state_reason


def test_a_two_core_machine_runs_a_one_node_two_rank_job_then_the_next(runner):
    r = runner(backend=TwoCoreLaptop())
    first = submit(r, nodes=1, procs=2)
    second = submit(r, nodes=1, procs=2)  # node-1 has 2 free slots, the machine no core
    assert r.schedule_once() == [first]
    reason, _ = r.queue_info(second)
    assert reason == (
        "waiting: this machine's 2 cores run 2 ranks of other jobs (one rank per core;"
        " restart the gateway with --oversubscribe to share cores)"
    )
    assert state(r, second) is JobState.QUEUED


def test_a_job_wider_than_the_cores_fails_with_the_flag_that_allows_it(runner):
    r = runner(backend=TwoCoreLaptop())
    wide = submit(r, nodes=2, procs=2)
    r.schedule_once()
    record = r.store.get_job(wide)
    assert record.state is JobState.FAILED
    assert "the job runs 4 ranks at once; this gateway runs at most 2 ranks" in record.state_reason
    assert "--oversubscribe" in record.state_reason


def test_an_oversubscribed_machine_runs_it_and_the_job_is_warned(runner):
    r = runner(backend=TwoCoreLaptop(oversubscribe=True))
    wide = submit(r, nodes=2, procs=2)
    assert r.schedule_once() == [wide]
    alerts = [e.payload_as(Alert) for e in r.store.read_events(wide) if e.type is EventType.ALERT]
    assert [a.kind for a in alerts] == ["oversubscribed"]
    assert alerts[0].detail.startswith("4 ranks (this job's 4, other jobs' 0) on 2 cores")
