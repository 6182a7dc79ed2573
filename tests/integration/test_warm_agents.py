"""Warm agents: restarts run on pre-started torchrun agents, and none outlives its owner.

A warm agent is a process that already imported torchrun, waiting for a launch. These
tests check what a user relies on: a restart takes them (the agent existed before the
attempt), a job runs the same with them off, and neither closing the backend, stopping
the gateway nor killing it leaves an idle one behind, while a job on warm agents keeps
running without its gateway.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest
from airtest import no_processes_left, rank_pid, stop_gateway_and_its_jobs, wait_for

from air_sdk._agent import is_agent
from air_sdk.client import Client
from air_sdk.gateway.server import (
    GatewayOptions,
    running_gateway,
    start_detached,
    stop_detached,
)
from air_sdk.runner.backends._warm import MARKER, READY_WORD
from air_sdk.runner.backends.local import (
    LocalBackend,
    agent_base_env,
    free_port,
    job_processes,
)
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm agents need Linux"),
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

#: importing torch takes ~2 s on a quiet machine; these suites share 2 busy cores
READY_TIMEOUT_S = 180


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def warm_processes(parent_pid: int, *, ready: bool = False) -> set[int]:
    """Idle warm processes of a gateway (or of this test process)."""
    found = set()
    for child in psutil.Process(parent_pid).children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if MARKER in cmdline and (not ready or READY_WORD in cmdline):
            found.add(child.pid)
    return found


def attempt_agents(job_id: str, attempt: int) -> dict[str, int]:
    """{node: pid} of the torchrun agents of one attempt, found by their environment."""
    agents = {}
    for pid in job_processes(job_id, attempt):
        try:
            p = psutil.Process(pid)
            if is_agent(p.cmdline()):
                agents[p.environ()["AIR_NODE_NAME"]] = pid
        except (psutil.Error, KeyError):
            continue
    return agents


def submit(client: Client, src: Path, steps: int, **spec) -> object:
    spec.setdefault("failure", {"backoff_base_s": 0.0, "backoff_max_s": 0.0})
    return client.submit(
        JobSpec(entrypoint="train.py", args=[str(steps)], resources=Resources(nodes=2), **spec),
        workdir=src,
    )


def at_step(job, step: int, timeout: float = 120) -> None:
    wait_for(lambda: (job.snapshot().step or 0) >= step, timeout, f"step {step}")


@pytest.fixture
def own_gateway(tmp_path_factory):
    """A gateway this test may stop or kill: (options, process)."""
    opts = GatewayOptions(
        port=free_port(),
        home=tmp_path_factory.mktemp("warm-gateway"),
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
    )
    gw = start_detached(opts)
    yield opts, gw
    latest = running_gateway(opts.home) or gw
    stop_gateway_and_its_jobs(latest.url, gw.token, opts.home)


# -- the backend itself --------------------------------------------------------------------


def test_closing_the_backend_kills_its_idle_warm_agents():
    backend = LocalBackend(2, 1, warm_agents=2)
    assert backend.warm_pool is not None
    backend.warm_pool.start()
    try:
        wait_for(lambda: backend.warm_pool.num_ready() == 2, READY_TIMEOUT_S, "2 warm agents")
        pids = set(backend.warm_pool.pids())
        assert pids == warm_processes(os.getpid(), ready=True)
    finally:
        backend.close()
    assert not any(alive(pid) for pid in pids)
    assert warm_processes(os.getpid()) == set()


def test_a_warm_process_runs_any_other_command_cold_in_place(tmp_path):
    """What is not a torchrun agent is exec'd as is, with the attempt's env, cwd and log."""
    backend = LocalBackend(1, 1, warm_agents=1)
    assert backend.warm_pool is not None
    backend.warm_pool.start()
    try:
        wait_for(lambda: backend.warm_pool.num_ready() == 1, READY_TIMEOUT_S, "a warm agent")
        env = {**agent_base_env(), "AIR_WARM_TEST": "hello"}
        agent = backend.warm_pool.take(env)
        assert agent is not None
        code = "import os; print(os.environ['AIR_WARM_TEST'], os.getcwd(), os.getpid())"
        log = tmp_path / "agent.log"
        assert agent.launch([sys.executable, "-c", code], env, str(tmp_path), str(log))
        assert agent.proc.wait(timeout=60) == 0
        assert log.read_text().split() == ["hello", str(tmp_path), str(agent.pid)]
    finally:
        backend.close()


# -- through a gateway ---------------------------------------------------------------------


def test_a_restart_after_a_sigkilled_rank_runs_on_warm_agents(own_gateway, workdir, tmp_path):
    opts, gw = own_gateway
    client = Client(gw.url, gw.token)
    stop = tmp_path / "stop"
    job = client.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(stop)],
            resources=Resources(nodes=2),
            max_restarts=1,
            failure={"backoff_base_s": 0.0, "backoff_max_s": 0.0},
        ),
        workdir=workdir(UNTIL_STOPPED),
    )
    at_step(job, 3)
    # The first launch found no pool: it starts filling then, once a core is idle.
    wait_for(lambda: len(warm_processes(gw.pid, ready=True)) >= 2, READY_TIMEOUT_S, "warm pool")
    ready = warm_processes(gw.pid, ready=True)
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGKILL)
    wait_for(lambda: len(attempt_agents(job.id, 2)) == 2, 120, "attempt 2's agents")
    agents = attempt_agents(job.id, 2)
    started_at = job.attempts()[1].started_at
    assert set(agents.values()) <= ready, (agents, ready)
    for pid in agents.values():
        assert psutil.Process(pid).create_time() < started_at
        assert psutil.Process(pid).environ()["AIR_JOB_ID"] == job.id  # what the sweep reads
        assert os.getsid(pid) == pid  # a session of its own, like a cold agent
    # and the pool warms replacements
    wait_for(lambda: warm_processes(gw.pid) - ready, 120, "replacement warm agents")
    stop.touch()
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert record.num_restarts == 1
    log = opts.home / "jobs" / job.id / "attempts" / "2" / "node-0.agent.log"
    assert log.exists()  # the agent's own output went to the attempt's log
    assert no_processes_left(job.id)


def test_a_job_restarts_and_succeeds_with_warm_agents_off(own_gateway_cold, workdir):
    opts, gw = own_gateway_cold
    client = Client(gw.url, gw.token)
    job = submit(client, workdir(LOOP), 60, max_restarts=1)
    at_step(job, 3)
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGKILL)
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert record.num_restarts == 1
    assert warm_processes(gw.pid) == set()
    assert no_processes_left(job.id)


@pytest.fixture
def own_gateway_cold(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AIR_WARM_AGENTS", "0")  # the gateway inherits it
    opts = GatewayOptions(
        port=free_port(),
        home=tmp_path_factory.mktemp("cold-gateway"),
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
    )
    gw = start_detached(opts)
    yield opts, gw
    stop_gateway_and_its_jobs(gw.url, gw.token, opts.home)


def test_idle_warm_agents_die_with_the_gateway_but_a_job_on_warm_agents_runs_on(
    own_gateway, workdir
):
    opts, gw = own_gateway
    client = Client(gw.url, gw.token)
    src = workdir(LOOP)
    assert submit(client, src, 3).wait(timeout=300).state is JobState.SUCCEEDED
    wait_for(lambda: len(warm_processes(gw.pid, ready=True)) >= 2, READY_TIMEOUT_S, "warm pool")
    ready = warm_processes(gw.pid, ready=True)
    job = submit(client, src, 100_000)  # runs until cancelled
    at_step(job, 3)
    agents = attempt_agents(job.id, 1)
    assert set(agents.values()) <= ready
    idle = wait_for(lambda: warm_processes(gw.pid), 120, "replacement warm agents")
    os.kill(gw.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in idle), 30, "idle warm agents to die")
    assert all(alive(pid) for pid in agents.values())  # the job does not need its gateway
    # A new gateway re-attaches to the warm agents' attempt, as to cold ones, and its
    # teardown (a cancel here) finds them.
    gw2 = start_detached(opts)
    job2 = Client(gw2.url, gw2.token).job(job.id)
    step = job2.snapshot().step or 0
    wait_for(lambda: (job2.snapshot().step or 0) > step + 5, 120, "steps after the re-attach")
    assert [a.attempt for a in job2.attempts()] == [1]
    job2.cancel()
    assert job2.wait(timeout=120).state is JobState.CANCELLED
    assert not any(alive(pid) for pid in agents.values())
    assert no_processes_left(job.id)
    # and stopping a gateway (SIGTERM) leaves none of its own warm agents behind
    idle2 = wait_for(lambda: warm_processes(gw2.pid), 120, "the new gateway's warm agents")
    stop_detached(opts.home)
    wait_for(lambda: not any(alive(pid) for pid in idle2), 30, "warm agents to be gone")
