"""The NodeRunner's promises, kept the same on every backend: the local one (a NodeRunner
process per virtual node) and Ray (a NodeRunner inside each node actor). Driven through
the `Backend` seam itself, without a gateway: a 1-node x 2-rank attempt whose ranks
each start a child in their process group and one in a session of its own.

* every live rank's Python stack can be read;
* a rank's end leaves an exit record (code or signal, its last lines) and the node's
  status names it;
* stopping the attempt leaves no process behind, not even one a rank detached, and
  returns only once they have finished exiting (a SIGKILLed process holding memory is
  torn down for a while; it was seen still there right after `terminate` under load).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from airtest import no_processes_left, wait_for

from air_sdk.runner.backends.base import LaunchRequest
from air_sdk.runner.backends.local import LocalBackend, free_port
from air_sdk.runner.node.plan import attempt_worker
from air_sdk.schema import JobSpec, NodeAssignment, Placement, RankExit, Resources

pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, subprocess, sys, time
# Each child holds 300 MB and 20 threads, as a DataLoader worker does: the kernel takes a
# while to tear such a process down after SIGKILL, and a stop must wait for that.
HOLD = (
    "import sys, threading, time; held = b'x' * (300 * 2**20); "
    "[threading.Thread(target=time.sleep, args=(3600,), daemon=True).start() for _ in range(20)]; "
    "open(sys.argv[1], 'w').close(); time.sleep(3600)"
)
rank = os.environ["RANK"]
ready = [os.path.join(sys.argv[1], f"ready-{rank}-{n}") for n in (0, 1)]
child = subprocess.Popen([sys.executable, "-c", HOLD, ready[0]])  # in the rank's group
loner = subprocess.Popen([sys.executable, "-c", HOLD, ready[1]], start_new_session=True)
while not all(os.path.exists(r) for r in ready):
    time.sleep(0.05)
with open(os.path.join(sys.argv[1], f"pids-{rank}.json"), "w") as f:
    json.dump([os.getpid(), child.pid, loner.pid], f)
print(f"rank {rank} up", flush=True)
if rank == "1" and sys.argv[2] == "fail":
    print("rank 1 fails on purpose", flush=True)
    sys.exit(5)

def wait_here():
    while True:
        time.sleep(0.05)

wait_here()
"""


@dataclass
class Setup:
    """One backend, and where its attempt's exit records end up."""

    name: str
    backend: Any
    node: str
    exits: Any  # (job_id, attempt_dir) -> Path of the exits/ directory


def _local() -> Iterator[Setup]:
    backend = LocalBackend(1, 2, warm=False)
    yield Setup("local", backend, "node-0", lambda job_id, attempt_dir: attempt_dir / "exits")


def _ray() -> Iterator[Setup]:
    ray = pytest.importorskip("ray", reason="needs `pip install air-runtime[ray]`")
    from ray.cluster_utils import Cluster

    from air_sdk.runner.backends.ray import RayBackend
    from air_sdk.runner.backends.ray_connect import reload_ray_config

    tmp = Path(tempfile.mkdtemp(prefix="airnr-", dir="/tmp"))  # Unix socket paths stay short
    (tmp / "ray").mkdir()
    cluster = None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", str(tmp))
        env.setenv("RAY_AUTH_MODE", "token")
        env.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
        env.delenv("RAY_ADDRESS", raising=False)
        reload_ray_config()
        try:
            cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 0,
                    "include_dashboard": False,
                    "gcs_server_port": free_port(),
                },
            )
            cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            backend = RayBackend(address=cluster.address, warm=False)
            node = backend.inventory()[0].name

            def exits(job_id: str, _attempt_dir: Path) -> Path:
                found = sorted(tmp.glob(f"**/air-{job_id}-*/attempt-1/exits"))
                assert found, f"no exit records of {job_id} under {tmp}"
                return found[0]

            yield Setup("ray", backend, node, exits)
        finally:
            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)], scope="module")
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    yield from (_local() if request.param == "local" else _ray())


def launch(setup: Setup, tmp_path: Path, mode: str) -> tuple[LaunchRequest, Any]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(SCRIPT))
    spec = JobSpec(
        entrypoint="train.py",
        args=[str(tmp_path), mode],
        resources=Resources(nodes=1, procs_per_node=2),
    )
    job_id = f"nr{secrets.token_hex(4)}"
    attempt_dir = tmp_path / "jobs" / job_id / "attempts" / "1"
    worker = attempt_worker(
        job_id=job_id,
        attempt=1,
        spec=spec,
        gateway_url="",
        job_token="",
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    request = LaunchRequest(
        job_id=job_id,
        attempt=1,
        spec=spec,
        placement=Placement(job_id=job_id, nodes=(NodeAssignment(node=setup.node, slots=2),)),
        code_dir=code,
        attempt_dir=attempt_dir,
        entrypoint="train.py",
        worker=worker,
    )
    return request, setup.backend.launch(request)


def pids_of(tmp_path: Path) -> dict[int, list[int]]:
    found = {}
    for rank in (0, 1):
        try:
            found[rank] = json.loads((tmp_path / f"pids-{rank}.json").read_text())
        except (OSError, ValueError):
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def exit_record(setup: Setup, request: LaunchRequest, rank: int) -> RankExit | None:
    path = setup.exits(request.job_id, request.attempt_dir) / f"rank-{rank}.json"
    try:
        return RankExit.model_validate_json(path.read_text())
    except OSError:
        return None


def test_stacks_of_every_rank_and_a_stop_that_leaves_no_process(setup, tmp_path):
    request, handle = launch(setup, tmp_path, "run")
    backend = setup.backend
    try:
        # polled as the runner polls: a backend moves an attempt on (Ray: from its nodes'
        # preparation to starting the ranks) when asked how it goes
        pids = wait_for(
            lambda: backend.poll(handle) and len(pids_of(tmp_path)) == 2 and pids_of(tmp_path),
            180,
            "2 ranks",
        )
        assert all(n.exit_code is None for n in backend.poll(handle))
        stacks = backend.rank_stacks(handle)
        assert set(stacks) == {0, 1}, stacks
        assert all("wait_here" in s and "train.py" in s for s in stacks.values()), stacks
        backend.terminate(handle, grace_s=1.0)
        everything = [pid for trio in pids.values() for pid in trio]
        assert not [pid for pid in everything if alive(pid)]  # the detached one included
        for rank in (0, 1):  # stopped by the runner's SIGTERM, and recorded so
            stopped = exit_record(setup, request, rank)
            assert stopped is not None and stopped.signal == "SIGTERM"
    finally:
        backend.release(request.job_id)
    wait_for(lambda: no_processes_left(request.job_id), 60, "nothing of the job left")


def test_a_failed_rank_is_recorded_and_named_by_the_nodes_status(setup, tmp_path):
    request, handle = launch(setup, tmp_path, "fail")
    backend = setup.backend
    try:
        status = wait_for(
            lambda: next((s for s in backend.poll(handle) if s.exit_code is not None), None),
            180,
            "the node to report the failure",
        )
        assert (status.exit_code, status.detail) == (5, "rank 1 exited with code 5")
        failed = exit_record(setup, request, 1)  # written before the node said it failed
        assert failed is not None and failed.exit_code == 5 and failed.node == setup.node
        assert "rank 1 fails on purpose" in failed.tail
        if setup.name == "ray":  # the record lives on the Ray node: it comes with the status
            assert [(e.rank, e.exit_code) for e in status.rank_exits] == [(1, 5)]
            assert "rank 1 fails on purpose" in status.rank_exits[0].tail
        pids = pids_of(tmp_path)
        backend.terminate(handle, grace_s=1.0)
        assert not [pid for trio in pids.values() for pid in trio if alive(pid)]
        stopped = exit_record(setup, request, 0)
        assert stopped is not None and stopped.signal == "SIGTERM"
    finally:
        backend.release(request.job_id)
    wait_for(lambda: no_processes_left(request.job_id), 60, "nothing of the job left")


def test_a_gateway_that_was_sigkilled_is_not_running(tmp_path):
    """Restarting a gateway right after killing it must work: a zombie, or a process
    still being torn down, is not a running gateway; nor is a later process that got
    the recorded pid."""
    import signal
    import subprocess
    import sys

    from air_sdk.gateway.server import STATE_FILE, running_gateway
    from air_sdk.runner.node._procs import create_time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    state = {"pid": child.pid, "url": "http://127.0.0.1:1", "started": create_time(child.pid)}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    assert running_gateway(tmp_path) is not None
    os.kill(child.pid, signal.SIGKILL)
    assert running_gateway(tmp_path) is None  # at once, dying or a zombie
    child.wait()
    mine = {**state, "pid": os.getpid()}  # a live process, but not the one recorded
    (tmp_path / STATE_FILE).write_text(json.dumps(mine))
    assert running_gateway(tmp_path) is None


SHOW_ITSELF = """
import os, sys
print("argv", sys.argv, "file", __file__, "name", __name__, flush=True)
print("path0", sys.path[0], "cwd", os.getcwd(), "pwd", os.environ["PWD"], flush=True)
print("main", sys.modules["__main__"].__file__, "session", os.getsid(0) == os.getpid(), flush=True)

def fail():
    raise ValueError("as python would say it")

fail()
"""


def test_a_rank_on_a_warm_interpreter_runs_as_python_would(tmp_path):
    """The same script, cold in attempt 1 and on a warm interpreter in attempt 2: the
    same output, traceback and exit status (a warm interpreter here imports only json,
    so the test does not wait for torch)."""
    from dataclasses import replace

    from air_sdk.runner.node.plan import plan_node
    from air_sdk.runner.node.process import NodeProcess, attempt_record_path
    from air_sdk.runner.node.records import AttemptRecord, RunnerRecord

    code = tmp_path / "code"
    code.mkdir()
    (code / "show.py").write_text(textwrap.dedent(SHOW_ITSELF))
    spec = JobSpec(entrypoint="show.py", args=["--lr", "1"])
    job = f"nr{secrets.token_hex(4)}"
    node_dir = tmp_path / "jobs" / job / "nodes" / "node-0"

    def launch(attempt: int):
        worker = attempt_worker(
            job_id=job, attempt=attempt, spec=spec, gateway_url="", job_token="", checkpoint_dir=""
        )
        attempt_dir = tmp_path / "jobs" / job / "attempts" / str(attempt)
        plan = plan_node(
            worker=worker,
            spec=spec,
            node="node-0",
            group_rank=0,
            num_nodes=1,
            entrypoint="show.py",
            cwd=str(code),
            attempt_dir=str(attempt_dir),
            log_path=str(attempt_dir / "nodes" / "node-0.log"),
            master=("127.0.0.1", free_port()),
            cuda_visible_devices="",
            loopback=True,
            warm=True,
        )
        return replace(plan, warm_imports=["json"]), attempt_dir

    def outcome(attempt_dir: Path) -> tuple[AttemptRecord, list[str]]:
        path = attempt_record_path(attempt_dir, "node-0")
        record = wait_for(
            lambda: (
                path.exists()
                and (r := AttemptRecord.from_dict(json.loads(path.read_text()))).verdict
                and r
            ),
            60,
            "the attempt's verdict",
        )
        lines = (attempt_dir / "nodes" / "node-0.log").read_text().splitlines()
        return record, [line for line in lines if line.startswith("[rank 0]")]

    first, first_dir = launch(1)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH")}
    process = NodeProcess.start(node_dir, job, "node-0", {**env, "AIR_JOB_ID": job}, first)
    try:
        cold, cold_lines = outcome(first_dir)
        wait_for(
            lambda: (NodeProcess.read(node_dir) or RunnerRecord(0, None, "", "")).warm_ready >= 1,
            60,
            "a warm interpreter",
        )
        second, second_dir = launch(2)
        process.send("launch", launch=second)
        warm, warm_lines = outcome(second_dir)
    finally:
        process.send("exit", grace_s=0.0)
        wait_for(lambda: not process.alive(), 30, "the NodeRunner to leave")
    assert [r.warm for r in cold.ranks] == [False] and [r.warm for r in warm.ranks] == [True]
    assert cold.verdict == warm.verdict == (1, "rank 0 exited with code 1")
    assert warm_lines == cold_lines, (cold_lines, warm_lines)
    assert (
        f"[rank 0] argv ['show.py', '--lr', '1'] file {code / 'show.py'} name __main__"
        in warm_lines
    )
    assert f"[rank 0] path0 {code} cwd {code} pwd {code}" in warm_lines
    assert "[rank 0] Traceback (most recent call last):" in warm_lines
    assert warm_lines[-1] == "[rank 0] ValueError: as python would say it"
    assert not any("_boot.py" in line for line in warm_lines)
