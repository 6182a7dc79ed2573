"""A job's failure on a node runs the operator's probe there at once, before the
restart picks its nodes: the controller, a fake backend whose rank the test fails,
and a real `NodeProber` (its loop not started, so only the failure can run it)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from air_sdk.runner import JobController, JobPaths
from air_sdk.runner.backends.base import NodeStatus
from air_sdk.runner.node_health import NodeHealthBook
from air_sdk.runner.node_probe import NodeProber
from air_sdk.runner.policy import NodeHealthPolicy
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import JobSpec, JobState, NodeAssignment, Placement, RankExit, Resources
from air_sdk.store import SqliteStore

NODES = [NodeSpec("n0", 1), NodeSpec("n1", 1)]
#: the probe fails on n1 only
FAILS_ON_N1 = "import os, sys; sys.exit('n1 is sick' if os.environ['AIR_NODE_NAME'] == 'n1' else 0)"


@dataclass
class _Attempt:
    exit_codes: dict[str, int | None]


@dataclass
class _Backend:
    name: str = "fake"
    attempts: list[_Attempt] = field(default_factory=list)

    def inventory(self):
        return list(NODES)

    def launch(self, request):
        self.attempts.append(_Attempt({n.node: None for n in request.placement.nodes}))
        return self.attempts[-1]

    def poll(self, handle):
        return [NodeStatus(n, c) for n, c in handle.exit_codes.items()]

    def terminate(self, handle, grace_s, wait_first_s=0.0):
        for n, c in handle.exit_codes.items():
            handle.exit_codes[n] = -15 if c is None else c

    def node_log_tail(self, handle, node, num_lines=20):
        return []

    def rank_stacks(self, handle):
        return {}

    def failure_marks(self, handle):
        return set()


def test_a_failure_probes_its_node_and_the_job_is_requeued_without_it(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    book = NodeHealthBook()
    prober = NodeProber([sys.executable, "-c", FAILS_ON_N1], 3600.0, lambda: NODES, book)
    spec = JobSpec(
        entrypoint="t.py",
        resources=Resources(nodes=2),
        max_restarts=3,
        failure={"backoff_base_s": 0.0, "backoff_max_s": 0.0},
    )
    job, _ = store.create_job(spec, tenant="default")
    job = store.transition(job.id, JobState.SCHEDULED, "placed")
    placement = Placement(
        job_id=job.id,
        nodes=(NodeAssignment(node="n0", slots=1), NodeAssignment(node="n1", slots=1)),
    )
    backend = _Backend()
    ctl = JobController(
        store,
        backend,
        job,
        placement,
        JobPaths(tmp_path / job.id),
        "http://gw",
        prepare_code=False,
        node_book=book,
        unhealthy_nodes=lambda: (
            NodeHealthPolicy().unhealthy(book.evidence(), time.time(), num_tenants=1)
            | prober.failing()
        ),
        probe_node=prober.probe_now,
    )
    ctl.step()
    assert prober.results() == {}  # nothing probed yet
    # an exit code is the code's doing: no evidence against n1, but the probe runs there
    exit_on_n1 = RankExit(rank=1, node="n1", exit_code=3, tail=["boom"])
    store.append_worker_events(ctl.job_id, ctl.attempt, 1, [exit_on_n1], None)
    backend.attempts[0].exit_codes["n1"] = 1
    assert ctl.step() == (JobState.STARTING, JobState.QUEUED)
    assert set(prober.results()) == {"n1"} and not prober.results()["n1"].ok
    assert "unhealthy node n1" in store.get_job(ctl.job_id).state_reason
