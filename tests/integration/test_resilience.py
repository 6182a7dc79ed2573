"""Fault injection on real 2-node gloo jobs: each scenario asserts the end state, the
restart count, the failure named, and that no process of the job is left behind."""

from __future__ import annotations

import os
import signal

import pytest
from airtest import (
    agent_pid,
    kill_tree,
    no_processes_left,
    rank_pid,
    stop_gateway_and_its_jobs,
    wait_for,
)

from air_sdk.client import Client
from air_sdk.gateway.server import (
    GatewayOptions,
    running_gateway,
    start_detached,
)
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

LOOP = """
import os, sys, time
import torch, torch.distributed as dist
import air_sdk.runtime as air

ctx = air.init()
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
print(f"attempt {ctx.attempt} rank {ctx.rank} starting", flush=True)
for step in range(1, steps + 1):
    t = torch.ones(1)
    dist.all_reduce(t)
    air.log(step=step, loss=1.0 / step)
    time.sleep(0.05)
print(f"rank {ctx.rank} done", flush=True)
air.shutdown()
"""


def submit(client: Client, src, *, args=(), **spec) -> object:
    spec.setdefault("failure", {"backoff_base_s": 0.2, "backoff_max_s": 0.5})
    return client.submit(
        JobSpec(entrypoint="train.py", args=list(args), resources=Resources(nodes=2), **spec),
        workdir=src,
    )


def running_at_step(job, step: int, timeout: float = 90) -> None:
    wait_for(lambda: (job.snapshot().step or 0) >= step, timeout, f"step {step}")


def test_sigkill_of_one_rank_restarts_the_job(gateway, workdir):
    job = submit(gateway, workdir(LOOP), args=["40"], max_restarts=1)
    running_at_step(job, 5)
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGKILL)
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert (record.num_restarts, record.charged_restarts) == (1, 1)
    first = job.attempts()[0]
    assert first.failure is not None and first.failure.rank == 1
    assert first.failure.signal == "SIGKILL" and first.failure.kind == "crash"
    # no checkpoints: the first attempt's work was all lost; the second's was kept
    assert first.productive_s == 0 and first.time_lost_s > 0
    assert job.attempts()[1].productive_s > 0
    assert 0 < gateway.job(job.id).record().goodput < 1
    assert no_processes_left(job.id)


def test_sigstop_of_one_rank_is_a_hang_with_stacks(gateway, workdir):
    job = submit(gateway, workdir(LOOP), args=["100000"], failure={"hang_timeout_s": 4})
    running_at_step(job, 5)
    os.kill(wait_for(lambda: rank_pid(job.id, 0), 30, "rank 0"), signal.SIGSTOP)
    record = job.wait(timeout=120)
    assert record.state is JobState.FAILED
    failure = record.failure
    assert failure.kind == "hang" and 0 in failure.stalled_ranks
    assert "hang_timeout_s" in failure.reason
    # every rank's Python stack, the stopped one included (py-spy reads stopped processes)
    assert set(failure.stacks) == {0, 1}
    assert "train.py" in failure.stacks[0]
    wait_for(lambda: no_processes_left(job.id), 30, "no process left")


SLOW_LOADER = """
import time
import air_sdk.runtime as air
ctx = air.init()
for step in range(1, 100000):
    if step == 8 and ctx.rank == 1:
        time.sleep(3600)  # a data loader stuck on a dead mount
    air.log(step=step, loss=1.0)
    time.sleep(0.05)
"""


def test_a_rank_stuck_in_its_data_loader_is_a_hang(gateway, workdir):
    job = submit(gateway, workdir(SLOW_LOADER), failure={"hang_timeout_s": 4})
    record = job.wait(timeout=120)
    assert record.state is JobState.FAILED and record.failure.kind == "hang"
    assert record.failure.stalled_ranks == [1]
    assert "time.sleep" in record.failure.stacks[1] or "<module>" in record.failure.stacks[1]
    wait_for(lambda: no_processes_left(job.id), 30, "no process left")


def test_sigkill_of_a_whole_node_restarts_the_job(gateway, workdir):
    job = submit(gateway, workdir(LOOP), args=["40"], max_restarts=1)
    running_at_step(job, 5)
    kill_tree(wait_for(lambda: agent_pid(job.id, "node-1"), 30, "node-1's agent"), signal.SIGKILL)
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert record.num_restarts == 1
    assert job.attempts()[0].failure.kind in ("lost_node", "crash")
    assert no_processes_left(job.id)


CRASH = """
import sys
import air_sdk.runtime as air
ctx = air.init()
air.log(step=1, loss=1.0)
print("out of luck", flush=True)
sys.exit(3 if ctx.rank == 0 else 0)
"""


def test_a_crash_loop_stops_at_max_restarts_with_a_clear_reason(gateway, workdir):
    job = submit(gateway, workdir(CRASH), max_restarts=2)
    record = job.wait(timeout=180)
    assert record.state is JobState.FAILED
    assert record.charged_restarts == 2 and len(job.attempts()) == 3
    assert (
        "all 2 restarts used" in record.state_reason
        and "raise --max-restarts" in record.state_reason
    )
    assert record.failure.rank == 0 and record.failure.exit_code == 3
    assert no_processes_left(job.id)


def test_sigterm_preemption_is_not_charged(gateway, workdir):
    job = submit(gateway, workdir(LOOP), args=["40"], max_restarts=0)
    running_at_step(job, 5)
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGTERM)
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert (record.num_restarts, record.charged_restarts) == (1, 0)
    assert job.attempts()[0].failure.kind == "preempted"


def test_cancel_during_backoff_ends_the_job(gateway, workdir):
    job = submit(
        gateway, workdir(CRASH), max_restarts=5, failure={"backoff_base_s": 60, "backoff_max_s": 60}
    )
    wait_for(lambda: job.status() is JobState.RESTARTING, 90, "RESTARTING")
    job.cancel()
    record = job.wait(timeout=30)
    assert record.state is JobState.CANCELLED
    assert len(job.attempts()) == 1
    assert no_processes_left(job.id)


@pytest.fixture
def own_gateway(tmp_path_factory):
    """A gateway this test may kill: (options, its process)."""
    opts = GatewayOptions(
        port=free_port(),
        home=tmp_path_factory.mktemp("own-gateway"),
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
    )
    gw = start_detached(opts)
    yield opts, gw
    latest = running_gateway(opts.home) or gw  # the test may have restarted it
    stop_gateway_and_its_jobs(latest.url, gw.token, opts.home)


def kill_gateway(opts, gw) -> None:
    os.kill(gw.pid, signal.SIGKILL)
    wait_for(lambda: running_gateway(opts.home) is None, 15, "the gateway to be gone")


def test_sigkill_of_the_gateway_while_a_job_runs(own_gateway, workdir):
    opts, gw = own_gateway
    client = Client(gw.url, gw.token)
    job = submit(client, workdir(LOOP), args=["120"])
    running_at_step(job, 5)
    kill_gateway(opts, gw)
    assert rank_pid(job.id, 0) is not None  # training goes on without the gateway
    gw2 = start_detached(opts)
    record = Client(gw2.url, gw2.token).job(job.id).wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert [a.attempt for a in job.attempts()] == [1]  # adopted, not relaunched
    events = job.events(after=0, limit=10_000).events
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    steps = sorted({r.step for r in job.metrics(name="loss") if r.rank == 0})
    assert steps == list(range(1, 121))  # nothing lost while the gateway was away
    assert no_processes_left(job.id)


def test_sigkill_of_the_gateway_after_accepting_a_submit(own_gateway, workdir):
    opts, gw = own_gateway
    client = Client(gw.url, gw.token)
    src = workdir(LOOP)
    blocker = submit(client, src, args=["100000"])
    running_at_step(blocker, 2)
    spec = JobSpec(entrypoint="train.py", args=["5"], resources=Resources(nodes=2))
    queued = client.submit(spec, workdir=src, idempotency_key="exactly-once")
    assert queued.status() is JobState.QUEUED  # accepted, not launched
    kill_gateway(opts, gw)
    gw2 = start_detached(opts)
    client2 = Client(gw2.url, gw2.token)
    again = client2.submit(spec, workdir=src, idempotency_key="exactly-once")
    assert again.id == queued.id
    assert sum(1 for j in client2.jobs() if j.name == spec.name and j.spec.args == ["5"]) == 1
    blocker.cancel()
    assert again.wait(timeout=180).state is JobState.SUCCEEDED
    assert no_processes_left(blocker.id) and no_processes_left(again.id)
