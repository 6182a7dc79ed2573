"""Helpers shared by the tests (on sys.path through pytest's `pythonpath`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from air_sdk.runner.node.records import AttemptRecord, RunnerRecord

#: a local NodeRunner process's command line: python -m air_sdk.runner.node NODE_DIR JOB NODE
NODE_RUNNER = "air_sdk.runner.node"


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


def job_processes(job_id: str, attempt: int | None = None) -> set[int]:
    """Pids of live processes whose environment names this job (and attempt): the test's
    own view of the host, independent of what the product records. NodeRunner
    processes, ranks, warm interpreters and what ranks start all carry AIR_JOB_ID."""
    found = set()
    for p in psutil.process_iter(["pid"]):
        if p.pid == os.getpid():
            continue
        try:
            env = p.environ()
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if env.get("AIR_JOB_ID") != job_id:
            continue
        if attempt is not None and env.get("AIR_ATTEMPT") != str(attempt):
            continue
        found.add(p.pid)
    return found


def no_processes_left(job_id: str) -> bool:
    return not job_processes(job_id)


def node_runners(job_id: str) -> dict[str, tuple[int, Path]]:
    """{node: (pid, node directory)} of the job's local NodeRunner processes."""
    found = {}
    for pid in job_processes(job_id):
        try:
            cmdline = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if NODE_RUNNER in cmdline and len(cmdline) >= cmdline.index(NODE_RUNNER) + 4:
            at = cmdline.index(NODE_RUNNER)
            found[cmdline[at + 3]] = (pid, Path(cmdline[at + 1]))
    return found


def attempt_records(job_id: str) -> list[AttemptRecord]:
    """The current attempt's node records, read from where the NodeRunners keep them."""
    records = []
    for _node, (_pid, node_dir) in sorted(node_runners(job_id).items()):
        try:
            runner = RunnerRecord.from_dict(json.loads((node_dir / "runner.json").read_text()))
            path = node_dir.parent.parent / "attempts" / str(runner.attempt) / "nodes"
            data = json.loads((path / f"{runner.node}.json").read_text())
        except (OSError, ValueError, TypeError):
            continue
        records.append(AttemptRecord.from_dict(data))
    return records


def rank_pid(job_id: str, rank: int) -> int | None:
    """The pid of the training process of `rank`: from its NodeRunner's record (local;
    behind a sandbox the interpreter below it, None until the sandbox started it), else
    the topmost process whose environment says it is that rank (a Ray node)."""
    from air_sdk.runner.node import _procs
    from air_sdk.runner.node.sandbox import is_sandbox_wrapper

    for record in attempt_records(job_id):
        for r in record.ranks:
            if r.rank == rank and r.returncode is None:
                inner = _procs.payload(r.pid)
                argv = _procs._cmdline(inner)
                # still starting: the sandbox not yet built, or the NodeRunner's fork of
                # it not yet exec'd (it shows the NodeRunner's command line meanwhile)
                starting = is_sandbox_wrapper(argv) or "air_sdk.runner.node" in argv
                return None if starting else inner
    candidates = {}
    for pid in job_processes(job_id):
        try:
            p = psutil.Process(pid)
            if p.environ().get("RANK") == str(rank):
                candidates[pid] = p
        except psutil.Error:
            continue
    for pid, p in candidates.items():
        try:
            parent = p.ppid()
        except psutil.Error:
            continue
        if parent not in candidates:  # not a DataLoader worker or a forked writer of it
            return pid
    return None


def agent_pid(job_id: str, node: str) -> int | None:
    """The pid of `node`'s NodeRunner process (its launcher: the ranks die with it)."""
    found = node_runners(job_id).get(node)
    return found[0] if found else None


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


def run_in_own_session(
    script: Path, *args: str, env: dict[str, str], timeout_s: float, on_hang: str
) -> str:
    """`python SCRIPT ARGS` in a session of its own; its output (stdout and stderr
    together). Still running after `timeout_s`, the whole session is killed (a hung
    child of it too: `subprocess.run(timeout=)` would wait on the pipes a grandchild
    holds) and the test fails with `on_hang` and the output; a non-zero exit fails it."""
    import signal
    import subprocess
    import sys

    import pytest

    with subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"{on_hang}:\n{out}")
    assert proc.returncode == 0, out
    return out
