"""Helpers shared by the tests (on sys.path through pytest's `pythonpath`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil

from air_sdk._agent import is_agent
from air_sdk.runner.backends.local import job_processes, rank_processes


def wait_for(
    predicate: Callable[[], object], timeout_s: float = 60, what: str = "condition"
) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def no_processes_left(job_id: str) -> bool:
    return not job_processes(job_id)


def _job_procs(job_id: str):

    for pid in job_processes(job_id):
        try:
            p = psutil.Process(pid)
            yield p, p.cmdline(), p.environ()
        except psutil.Error:
            continue


def rank_pid(job_id: str, rank: int) -> int | None:
    """The pid of the training process of `rank` (the supervisor's child)."""
    return rank_processes(job_id).get(rank)


def agent_pid(job_id: str, node: str) -> int | None:
    """The pid of the torchrun agent of `node` for the job's live attempt."""
    for p, cmdline, env in _job_procs(job_id):
        if env.get("AIR_NODE_NAME") == node and is_agent(cmdline):
            return p.pid
    return None


def kill_tree(pid: int, sig: int) -> None:
    """Send `sig` to `pid` and all its descendants (a whole virtual node)."""
    import os

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        try:
            os.kill(p.pid, sig)
        except OSError:
            pass


def stop_gateway_and_its_jobs(url: str, token: str, home) -> None:  # type: ignore[no-untyped-def]
    """Test teardown: a stopped gateway leaves running jobs running (a restart
    re-attaches), so cancel what is still active first, then stop it, then kill
    anything of its jobs a failed test left behind."""
    import os
    import signal

    from air_sdk.client import Client
    from air_sdk.gateway.server import stop_detached

    job_ids: list[str] = []
    try:
        client = Client(url, token, max_attempts=1)
        for record in client.jobs(limit=1000):
            job_ids.append(record.id)
            if not record.state.terminal:
                client.job(record.id).cancel()
        for job_id in job_ids:
            try:
                wait_for(lambda j=job_id: client.job(j).record().state.terminal, 30, "cancel")
            except AssertionError:
                pass
    except Exception:
        pass  # the gateway may be the thing that failed
    stop_detached(home)
    for job_id in job_ids:
        for pid in job_processes(job_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def torchrun_two_ranks(script: Path, *args: str, **extra_env: str) -> str:
    """Run `script ARGS` under `torchrun --standalone --nproc-per-node 2` with a clean
    torch/AIR environment (gloo on loopback) and return its output; fails on a non-zero exit.
    """
    return torchrun_ranks(2, script, *args, **extra_env)


def torchrun_ranks(
    nproc: int, script: Path, *args: str, timeout_s: float = 280, **extra_env: str
) -> str:
    """`torchrun_two_ranks` with `nproc` ranks and a time limit of `timeout_s`."""
    import os
    import subprocess
    import sys

    import air_sdk

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIR_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        PYTHONPATH=str(Path(air_sdk.__file__).resolve().parents[1]),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        **extra_env,
    )
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        + ["--nproc-per-node", str(nproc), str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr
