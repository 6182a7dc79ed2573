"""Warm interpreters: a restart's ranks start on interpreters that already imported
torch, and neither they nor their NodeRunner outlive the job.

A NodeRunner keeps one pre-imported interpreter per local rank for its job's next
attempt. These tests check what a user relies on: a restart takes them (they existed
before the attempt), a job runs the same with them off, a job on them keeps running
through a SIGKILL of its gateway and a restarted gateway re-attaches to it, and once
the job ends nothing of it is left.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest
from airtest import (
    attempt_records,
    no_processes_left,
    node_runners,
    rank_pid,
    stop_gateway_and_its_jobs,
    wait_for,
)

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, running_gateway, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.runner.node import _procs
from air_sdk.runner.node.records import RunnerRecord
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm interpreters need Linux"),
]

LOOP = """
import sys, time
import torch, torch.distributed as dist
import air_sdk.runtime as air

ctx = air.init()
steps = int(sys.argv[1])
for step in range(1, steps + 1):
    t = torch.ones(1)
    dist.all_reduce(t)
    air.log(step=step, loss=1.0 / step)
    time.sleep(0.05)
air.shutdown()
"""

UNTIL_STOPPED = """
import os, sys, time
import torch, torch.distributed as dist
import air_sdk.runtime as air

ctx = air.init()
stop, step = sys.argv[1], 0
print(f"attempt {ctx.attempt} rank {ctx.rank} torch was imported before the script", flush=True)
while True:  # until the test creates the stop file (rank 0 tells the others)
    step += 1
    flag = torch.tensor([1.0 if ctx.rank == 0 and os.path.exists(stop) else 0.0])
    dist.all_reduce(flag)
    air.log(step=step, loss=1.0 / step)
    if flag.item() > 0:
        break
    time.sleep(0.05)
air.shutdown()
"""

#: importing torch and torch._dynamo takes ~3 s on a quiet machine; the suites share 2 cores
READY_TIMEOUT_S = 240


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def warm_ready(job_id: str) -> int:
    """How many warm interpreters the job's NodeRunners have ready (their records)."""
    ready = 0
    for _pid, node_dir in node_runners(job_id).values():
        try:
            data = json.loads((node_dir / "runner.json").read_text())
            ready += RunnerRecord.from_dict(data).warm_ready
        except (OSError, ValueError, TypeError):
            continue
    return ready


def warm_interpreters(job_id: str) -> set[int]:
    """Idle warm interpreters of the job: live children of its NodeRunners that are not
    ranks."""
    ranks = {r.pid for record in attempt_records(job_id) for r in record.ranks}
    found = set()
    for pid, _dir in node_runners(job_id).values():
        try:
            children = psutil.Process(pid).children()
        except psutil.Error:
            continue
        for c in children:
            try:  # an ended rank its NodeRunner has not reaped yet is no interpreter
                if c.pid not in ranks and c.status() != psutil.STATUS_ZOMBIE:
                    found.add(c.pid)
            except psutil.Error:
                continue
    return found


def at_step(job, step: int, timeout: float = 180) -> None:
    wait_for(lambda: (job.snapshot().step or 0) >= step, timeout, f"step {step}")


def own_gateway_opts(tmp_path_factory, name: str) -> GatewayOptions:
    return GatewayOptions(
        port=free_port(),
        home=tmp_path_factory.mktemp(name),
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        sandbox_binds=(tmp_path_factory.getbasetemp(),),  # the jobs read the test's stop file
    )


@pytest.fixture
def own_gateway(tmp_path_factory):
    """A gateway this test may kill: (options, process)."""
    opts = own_gateway_opts(tmp_path_factory, "warm-gateway")
    gw = start_detached(opts)
    yield opts, gw
    latest = running_gateway(opts.home) or gw
    stop_gateway_and_its_jobs(latest.url, gw.token, opts.home)


@pytest.fixture
def own_gateway_cold(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AIR_WARM_RANKS", "0")  # the gateway inherits it
    opts = own_gateway_opts(tmp_path_factory, "cold-gateway")
    gw = start_detached(opts)
    yield opts, gw
    stop_gateway_and_its_jobs(gw.url, gw.token, opts.home)


def submit(client: Client, src: Path, args: list[str], **spec) -> object:
    spec.setdefault("failure", {"backoff_base_s": 0.0, "backoff_max_s": 0.0})
    return client.submit(
        JobSpec(entrypoint="train.py", args=args, resources=Resources(nodes=2), **spec),
        workdir=src,
    )


def test_a_restart_after_a_sigkilled_rank_runs_on_warm_interpreters(own_gateway, workdir, tmp_path):
    opts, gw = own_gateway
    client = Client(gw.url, gw.token)
    stop = tmp_path / "stop"
    job = submit(client, workdir(UNTIL_STOPPED), [str(stop)], max_restarts=1)
    at_step(job, 3)
    # The NodeRunners warm the next attempt's interpreters once a core is idle.
    wait_for(lambda: warm_ready(job.id) >= 2, READY_TIMEOUT_S, "2 warm interpreters")
    ready = warm_interpreters(job.id)
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGKILL)
    wait_for(
        lambda: len([r for r in attempt_records(job.id) if r.attempt == 2 and r.ranks]) == 2,
        120,
        "attempt 2 on both nodes",
    )
    ranks = [r for record in attempt_records(job.id) for r in record.ranks]
    started_at = job.attempts()[1].started_at
    assert {r.pid for r in ranks} <= ready, (ranks, ready)
    assert all(r.warm for r in ranks)
    for r in ranks:
        p = psutil.Process(r.pid)
        assert p.create_time() < started_at  # it existed before the attempt
        inner = _procs.payload(r.pid)  # the interpreter, below the job's sandbox if any
        # the job's own process (its sandbox's wrapper starts with an empty environment)
        assert psutil.Process(inner).environ()["AIR_JOB_ID"] == job.id
        assert os.getsid(inner) == inner  # a session of its own, like a cold rank
    # and the NodeRunners warm replacements for the attempt after
    wait_for(lambda: warm_interpreters(job.id) - ready, READY_TIMEOUT_S, "replacements")
    stop.touch()
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert record.num_restarts == 1
    texts = [line.text for line in job.logs(attempt=2)]
    assert "attempt 2 rank 1 torch was imported before the script" in texts
    for node in ("node-0", "node-1"):
        log = opts.home / "jobs" / job.id / "attempts" / "2" / "nodes" / f"{node}.log"
        assert "(1 of 1 on warm interpreters)" in log.read_text()
    wait_for(lambda: no_processes_left(job.id), 30, "nothing of the job left")


def test_a_job_restarts_and_succeeds_with_warm_interpreters_off(own_gateway_cold, workdir):
    opts, gw = own_gateway_cold
    client = Client(gw.url, gw.token)
    job = submit(client, workdir(LOOP), ["60"], max_restarts=1)
    at_step(job, 3)
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGKILL)
    # once attempt 2's ranks are recorded on both nodes (before, a NodeRunner's new
    # children are not in its records yet and would look like warm interpreters)
    wait_for(
        lambda: len([r for r in attempt_records(job.id) if r.attempt == 2 and r.ranks]) == 2,
        120,
        "attempt 2 on both nodes",
    )
    extra = warm_interpreters(job.id)
    info = []
    for pid in extra:
        try:
            p = psutil.Process(pid)
            info.append((pid, p.status(), p.cmdline()[:3], p.environ().get("AIR_ATTEMPT")))
        except psutil.Error as exc:
            info.append((pid, str(exc)))
    info.append([(r.attempt, [x.pid for x in r.ranks]) for r in attempt_records(job.id)])
    assert extra == set(), info
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert record.num_restarts == 1
    log = opts.home / "jobs" / job.id / "attempts" / "2" / "nodes" / "node-1.log"
    assert "(0 of 1 on warm interpreters)" in log.read_text()
    wait_for(lambda: no_processes_left(job.id), 30, "nothing of the job left")


def test_a_job_on_warm_interpreters_runs_on_through_a_gateway_sigkill(own_gateway, workdir):
    opts, gw = own_gateway
    client = Client(gw.url, gw.token)
    job = submit(client, workdir(LOOP), ["100000"], max_restarts=1)  # runs until cancelled
    at_step(job, 3)
    wait_for(lambda: warm_ready(job.id) >= 2, READY_TIMEOUT_S, "2 warm interpreters")
    os.kill(wait_for(lambda: rank_pid(job.id, 0), 30, "rank 0"), signal.SIGKILL)
    wait_for(lambda: job.attempts()[-1].attempt == 2 and (job.snapshot().step or 0) > 3, 120, "2")
    runners = {pid for pid, _ in node_runners(job.id).values()}
    ranks = {r.pid for record in attempt_records(job.id) for r in record.ranks}
    assert len(runners) == 2 and len(ranks) == 2
    os.kill(gw.pid, signal.SIGKILL)
    os.waitpid(gw.pid, 0)  # the test started it: reap it, or it lingers as a zombie
    assert all(alive(pid) for pid in runners | ranks)  # the job does not need its gateway
    # A new gateway (started at once: the old one is gone) re-attaches to the attempt,
    # and its teardown (a cancel here) finds every process of it.
    gw2 = start_detached(opts)
    job2 = Client(gw2.url, gw2.token).job(job.id)
    step = job2.snapshot().step or 0
    wait_for(lambda: (job2.snapshot().step or 0) > step + 5, 120, "steps after the re-attach")
    assert [a.attempt for a in job2.attempts()] == [1, 2]
    job2.cancel()
    assert job2.wait(timeout=120).state is JobState.CANCELLED
    wait_for(lambda: not any(alive(pid) for pid in runners | ranks), 30, "its processes gone")
    wait_for(lambda: no_processes_left(job.id), 30, "warm interpreters gone too")


def test_nothing_of_a_finished_job_is_left(own_gateway, workdir, tmp_path):
    opts, gw = own_gateway
    client = Client(gw.url, gw.token)
    stop = tmp_path / "stop"
    job = submit(client, workdir(UNTIL_STOPPED), [str(stop)])
    at_step(job, 3)
    wait_for(lambda: warm_ready(job.id) >= 2, READY_TIMEOUT_S, "warm interpreters")
    stop.touch()
    assert job.wait(timeout=300).state is JobState.SUCCEEDED
    # its NodeRunners and their warm interpreters leave with the job
    assert no_processes_left(job.id)
