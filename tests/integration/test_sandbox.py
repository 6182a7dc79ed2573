"""Jobs cannot read the gateway's secrets on the local backend (issue 14, item 6).

Each attack an outside probe made, through a real gateway whose ranks run sandboxed
(bwrap, then the `unshare` jail): a job reads `AIR_HOME/token`, `air.db`, another
job's secrets file and directory, and `/proc/<pid>/environ` of another job's rank
while that job runs. Every read must fail, while the job still writes its own
checkpoint directory and finishes. Then the NodeRunner's promises behind a sandbox:
stacks of every rank, exit records, a stop that leaves no process.

bubblewrap must be installed on Linux (`make test` installs it: `make sandbox-deps`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from airtest import (
    attempt_records,
    no_processes_left,
    rank_pid,
    stop_gateway_and_its_jobs,
    wait_for,
)

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.base import LaunchRequest
from air_sdk.runner.backends.local import LocalBackend, free_port
from air_sdk.runner.node import _procs
from air_sdk.runner.node.plan import attempt_worker
from air_sdk.runner.node.sandbox import SandboxSpec, bwrap_argv, under_tmp, unshare_argv
from air_sdk.schema import JobSpec, JobState, NodeAssignment, Placement, RankExit, Resources

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes need Linux"),
]
KINDS = ["bwrap", "unshare"]


def _need(kind: str) -> None:
    if kind == "bwrap" and shutil.which("bwrap") is None:
        pytest.fail("bwrap is not installed: apt-get install bubblewrap (make sandbox-deps)")


# ---- attacks through a real gateway ---------------------------------------------------------

VICTIM = """
import time
print("victim up", flush=True)
time.sleep(600)
"""

ATTACKER = """
import glob, json, os, sys
home, victim, pids = sys.argv[1], sys.argv[2], sys.argv[3:]
result = {}

def attempt(name, read):
    try:
        result[name] = f"READ {len(read())} bytes"
    except OSError as exc:
        result[name] = f"REFUSED {type(exc).__name__}"

attempt("token", lambda: open(os.path.join(home, "token")).read())
attempt("air.db", lambda: open(os.path.join(home, "air.db"), "rb").read())
attempt("air.db-wal", lambda: open(os.path.join(home, "air.db-wal"), "rb").read())
attempt("secrets", lambda: open(os.path.join(home, "secrets", victim + ".json")).read())
attempt("victim dir", lambda: os.listdir(os.path.join(home, "jobs", victim)))
# its own NodeRunner's inbox: a launch written there would start ranks unsandboxed
own = os.path.join(home, "jobs", os.environ["AIR_JOB_ID"], "nodes")
attempt("own NodeRunner inbox", lambda: os.listdir(own))
for pid in pids:
    attempt(f"environ of {pid}", lambda: open(f"/proc/{pid}/environ", "rb").read())
leaked = []
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        if b"WANDB_API_KEY" in open(path, "rb").read():
            leaked.append(path)
    except OSError:
        pass
result["environ scan"] = leaked
os.makedirs(os.environ["AIR_CHECKPOINT_DIR"], exist_ok=True)
with open(os.path.join(os.environ["AIR_CHECKPOINT_DIR"], "mine.txt"), "w") as f:
    f.write("ok")
result["own checkpoint"] = "WROTE"
print("RESULT " + json.dumps(result), flush=True)
"""


@pytest.fixture(scope="module", params=KINDS)
def sandboxed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Client, Path]]:
    _need(request.param)
    home = tmp_path_factory.mktemp("air-home")
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        sandbox=request.param,
    )
    gw = start_detached(opts)
    try:
        assert f"sandboxed with {request.param}" in gw.log_path.read_text()
        yield Client(gw.url, gw.token), home
    finally:
        stop_gateway_and_its_jobs(gw.url, gw.token, home)


def test_a_job_reads_neither_the_gateways_files_nor_another_jobs_secrets(sandboxed, tmp_path):
    gateway, home = sandboxed
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "train.py").write_text(textwrap.dedent(VICTIM))
    (tmp_path / "attacker").mkdir()
    (tmp_path / "attacker" / "train.py").write_text(textwrap.dedent(ATTACKER))
    key = f"canary-{secrets.token_hex(8)}"
    victim = gateway.submit_script(tmp_path / "victim" / "train.py", env={"WANDB_API_KEY": key})
    try:
        inner = wait_for(lambda: rank_pid(victim.id, 0), 120, "the victim's rank")
        outer = [r.pid for rec in attempt_records(victim.id) for r in rec.ranks][0]
        assert outer != inner  # the sandbox's own process, whose environment is the rank's too
        # on the host, every one of these can be read: the attacks below are real ones
        assert (home / "token").is_file() and (home / "air.db").is_file()
        assert (home / "secrets" / f"{victim.id}.json").is_file()
        assert key.encode() in Path(f"/proc/{inner}/environ").read_bytes()
        # running (its rank reported) before the attack, so "still running" after means
        # unharmed; a busy host can take longer than the attack to get its first report in
        wait_for(lambda: victim.status() is JobState.RUNNING, 120, "the victim running")

        attacker = gateway.submit_script(
            tmp_path / "attacker" / "train.py", args=[str(home), victim.id, str(outer), str(inner)]
        )
        record = attacker.wait(timeout=180)
        lines = [line.text for line in attacker.logs()]
        assert record.state is JobState.SUCCEEDED, (record.state_reason, lines)
        found = [json.loads(t[len("RESULT ") :]) for t in lines if t.startswith("RESULT ")]
        assert found, lines
        result = found[0]
        assert result.pop("own checkpoint") == "WROTE"
        assert result.pop("environ scan") == []
        assert all(v.startswith("REFUSED") for v in result.values()), result
        assert victim.status() is JobState.RUNNING
    finally:
        victim.cancel()
    victim.wait(timeout=120)
    wait_for(lambda: no_processes_left(victim.id), 60, "nothing of the victim left")


# ---- what a sandbox shows, without a gateway ----------------------------------------------

PROBE = """
import json, os, sys
home = sys.argv[1]
seen = {}
def check(name, fn):
    try:
        seen[name] = fn()
    except OSError as exc:
        seen[name] = type(exc).__name__
check("home", lambda: sorted(os.listdir(home)))
check("token", lambda: open(os.path.join(home, "token")).read())
check("write code", lambda: open(os.path.join(home, "jobs/a/code/new.txt"), "w").write("x"))
check("write nodes", lambda: open(os.path.join(home, "jobs/a/attempts/1/nodes/x"), "w").write("x"))
check("write usr", lambda: open("/usr/air-sandbox-test", "w").write("x"))
check("tmp", lambda: sorted(os.listdir("/tmp")))
check("pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
check("dev", lambda: sorted(os.listdir("/dev")))
check("cwd", os.getcwd)
print(json.dumps(seen))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_sandboxed_program_sees_its_own_directories_and_nothing_else(kind, tmp_path):
    _need(kind)
    home = tmp_path / "home"
    code = home / "jobs" / "a" / "code"
    nodes = home / "jobs" / "a" / "attempts" / "1" / "nodes"
    for d in (code, nodes, home / "jobs" / "a" / "tmp", home / "jobs" / "b"):
        d.mkdir(parents=True)
    (home / "token").write_text("admin token")
    (tmp_path / "host-tmp-file").write_text("x")
    spec = SandboxSpec(
        hide=[str(home)],
        writable=[str(code), str(nodes.parent)],
        tmp=str(home / "jobs" / "a" / "tmp"),
        read_only=[str(nodes)],
        cwd=str(code),
        # as the backend does: this interpreter stays visible if it lives under /tmp
        keep=under_tmp([sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]),
    )
    wrapper = (
        bwrap_argv(spec, shutil.which("bwrap") or "") if kind == "bwrap" else unshare_argv(spec)
    )
    import subprocess

    out = subprocess.run(
        [*wrapper, sys.executable, "-c", PROBE, str(home)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["home"] == ["jobs"]  # the token, air.db, secrets: gone
    assert seen["token"] == "FileNotFoundError"
    assert seen["write code"] == 1 and (code / "new.txt").read_text() == "x"
    assert seen["write nodes"] == "OSError"  # read-only: EROFS
    assert seen["write usr"] in ("OSError", "PermissionError")
    assert "host-tmp-file" not in json.dumps(seen["tmp"])
    assert len(seen["pids"]) <= 3  # the sandbox's init, the program (bwrap: and itself)
    assert "sda" not in seen["dev"] and "null" in seen["dev"]
    assert seen["cwd"] == str(code)


@pytest.mark.parametrize("kind", KINDS)
def test_a_shared_directory_holding_tmp_shows_the_hosts_files_there(kind, tmp_path):
    """`--sandbox-bind /tmp` (what the benchmarks use to collect their jobs' results):
    the rank writes the host's /tmp, as with bwrap, and the jail's own /tmp does not come
    back over it; the home inside it stays hidden."""
    _need(kind)
    import subprocess
    import tempfile

    host_tmp = os.path.realpath(tempfile.gettempdir())
    if not os.path.realpath(tmp_path).startswith(host_tmp + "/"):
        pytest.skip(f"the test's directory is not under {host_tmp}")
    home = tmp_path / "home"
    (home / "jobs" / "a" / "tmp").mkdir(parents=True)
    (home / "token").write_text("admin token")
    out = tmp_path / "results" / "out.txt"
    out.parent.mkdir()
    spec = SandboxSpec(
        hide=[str(home)],
        writable=[],
        tmp=str(home / "jobs" / "a" / "tmp"),
        shared=[host_tmp],
        keep=under_tmp([sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]),
    )
    wrapper = (
        bwrap_argv(spec, shutil.which("bwrap") or "") if kind == "bwrap" else unshare_argv(spec)
    )
    probe = (
        "import os, sys; open(sys.argv[1], 'w').write('from the rank');"
        " print(sorted(os.listdir(sys.argv[2])))"
    )
    ran = subprocess.run(
        [*wrapper, sys.executable, "-c", probe, str(out), str(home)],
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    assert out.read_text() == "from the rank"
    assert ran.stdout.strip() == "[]"  # the token and jobs under the hidden home: gone


# ---- the NodeRunner behind a sandbox ------------------------------------------------------

RANKS = """
import os, subprocess, sys, time
sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
child = subprocess.Popen(sleeper)  # in the rank's process group, as a DataLoader worker
loner = subprocess.Popen(sleeper, start_new_session=True)  # one that left it
print(f"rank {os.environ['RANK']} up", flush=True)
if os.environ["RANK"] == "1" and sys.argv[1] == "fail":
    sys.exit(5)

def wait_here():
    while True:
        time.sleep(0.05)

wait_here()
"""


def _launch(kind: str, tmp_path: Path, mode: str) -> tuple[LocalBackend, LaunchRequest, object]:
    backend = LocalBackend(1, 2, warm=False, sandbox=kind)
    assert backend.sandbox.kind == kind
    job_id = f"sb{secrets.token_hex(4)}"
    root = tmp_path / "jobs" / job_id
    code = root / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(textwrap.dedent(RANKS))
    spec = JobSpec(
        entrypoint="train.py", args=[mode], resources=Resources(nodes=1, procs_per_node=2)
    )
    worker = attempt_worker(
        job_id=job_id,
        attempt=1,
        spec=spec,
        gateway_url="",
        job_token="",
        checkpoint_dir=str(root / "checkpoints"),
    )
    request = LaunchRequest(
        job_id=job_id,
        attempt=1,
        spec=spec,
        placement=Placement(job_id=job_id, nodes=(NodeAssignment(node="node-0", slots=2),)),
        code_dir=code,
        attempt_dir=root / "attempts" / "1",
        entrypoint="train.py",
        worker=worker,
    )
    return backend, request, backend.launch(request)


def _exit(request: LaunchRequest, rank: int) -> RankExit | None:
    try:
        path = request.attempt_dir / "exits" / f"rank-{rank}.json"
        return RankExit.model_validate_json(path.read_text())
    except OSError:
        return None


@pytest.mark.parametrize("kind", KINDS)
def test_behind_a_sandbox_stacks_exit_records_and_a_stop_leave_no_process(kind, tmp_path):
    _need(kind)
    backend, request, handle = _launch(kind, tmp_path, "run")
    try:
        log = request.attempt_dir / "nodes" / "node-0.log"
        wait_for(lambda: log.exists() and log.read_text().count(" up") == 2, 120, "both ranks up")
        stacks = backend.rank_stacks(handle)  # type: ignore[arg-type]
        assert set(stacks) == {0, 1}, stacks
        assert all("wait_here" in s for s in stacks.values()), stacks
        backend.terminate(handle, grace_s=2.0)  # type: ignore[arg-type]
        for rank in (0, 1):  # the ranks got the SIGTERM, and the records say so
            ended = _exit(request, rank)
            assert ended is not None and ended.signal == "SIGTERM", ended
        # the children, the one in a session of its own included, went too
        runner = handle.nodes[0].process.pid  # type: ignore[attr-defined]
        wait_for(
            lambda: not [p for p in _procs.descendants(runner) if _procs.alive(p)],
            30,
            "no process left below the NodeRunner",
        )
    finally:
        backend.release(request.job_id)
    wait_for(lambda: no_processes_left(request.job_id), 60, "nothing of the job left")


@pytest.mark.parametrize("kind", KINDS)
def test_behind_a_sandbox_a_failed_rank_is_recorded_with_its_exit_code(kind, tmp_path):
    _need(kind)
    backend, request, handle = _launch(kind, tmp_path, "fail")
    try:
        status = wait_for(
            lambda: next((s for s in backend.poll(handle) if s.exit_code), None),  # type: ignore[arg-type]
            120,
            "the node's verdict",
        )
        assert status.exit_code == 5 and "rank 1 exited with code 5" in status.detail
        failed = _exit(request, 1)
        assert failed is not None and failed.exit_code == 5
    finally:
        backend.terminate(handle, grace_s=0.5)  # type: ignore[arg-type]
        backend.release(request.job_id)
    wait_for(lambda: no_processes_left(request.job_id), 60, "nothing of the job left")
    assert not os.path.exists(f"/dev/shm/air-{request.job_id}")
