"""Issue 19: a member of one tenant, through its own jobs, against the gateway's file
handling. Each attack runs through a real gateway and real sandboxed jobs:

* a job swaps an output file (and a directory) between a real one and a link to
  another tenant's secrets file while the owner downloads it: the secret never
  comes back;
* a job replaces its inline code file by a link to a file of the gateway's, then is
  preempted and placed again: the gateway rewrites its code without writing through
  the link.
"""

from __future__ import annotations

import secrets

import pytest
import requests
from airtest import wait_for

from air_sdk.client import Client
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

# Swaps out.txt between a file and a link, and dir d/ between a directory and a link,
# as fast as it can, until the test drops a `stop` file into its output directory.
SWAPPER = """
import os, sys, time
import air_sdk.runtime as air
air.init()
out = air.output_dir()
secret_file, secret_dir, victim = sys.argv[1], sys.argv[2], sys.argv[3]
(out / "out.txt").write_text("benign\\n")
(out / "d").mkdir()
(out / "d" / victim).write_text("benign\\n")
deadline = time.time() + 240
print("swapping", flush=True)
while not (out / "stop").exists() and time.time() < deadline:
    for _ in range(100):
        (out / "f.tmp").write_text("benign\\n")
        os.replace(out / "f.tmp", out / "out.txt")
        os.symlink(secret_file, out / "l.tmp")
        os.replace(out / "l.tmp", out / "out.txt")
        os.rename(out / "d", out / "d.real")
        os.symlink(secret_dir, out / "d")
        os.unlink(out / "d")
        os.rename(out / "d.real", out / "d")
air.shutdown()
"""

SLEEPER = """
import time
import air_sdk.runtime as air
air.init()
for _ in range(2400):
    if air.should_stop():
        break
    time.sleep(0.1)
air.shutdown()
"""


@pytest.fixture(scope="module")
def members(gateway: Client) -> dict[str, Client]:
    """A client with a member token of each of two fresh tenants on the module's gateway
    (the token itself under "<role>-token")."""
    found: dict = {}
    for role in ("victim", "attacker"):
        name = f"{role}-{secrets.token_hex(3)}"
        gateway.admin.create_tenant(name)
        token = gateway.admin.create_token(tenant=name, role="member").token
        found[role] = Client(gateway.gateway_url, token)
        found[f"{role}-token"] = token
    return found


def test_swapping_an_output_for_a_link_never_serves_another_tenant_s_secret(
    gateway_process, members, request
):
    home = gateway_process.log_path.parent
    canary = f"canary-{secrets.token_hex(12)}"
    victim = members["victim"].submit(
        JobSpec(code=SLEEPER, env={"WANDB_API_KEY": canary}, resources=Resources(nodes=1))
    )
    secret_file = home / "secrets" / f"{victim.id}.json"
    wait_for(secret_file.exists, 60, "the victim's secrets file")
    assert canary in secret_file.read_text()  # what the attacker is after
    request.addfinalizer(victim.cancel)  # its node is free for the next test, whatever happens
    attacker = members["attacker"].submit(
        JobSpec(
            code=SWAPPER,
            args=[str(secret_file), str(secret_file.parent), f"{victim.id}.json"],
            resources=Resources(nodes=1),
        )
    )
    outputs = home / "outputs" / attacker.id
    wait_for(lambda: (outputs / "d.real").exists() or (outputs / "d").exists(), 180, "swaps")
    url = f"{gateway_process.url}/v1/jobs/{attacker.id}/outputs"
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {members['attacker-token']}"
    answers: list[requests.Response] = []
    try:
        for i in range(300):
            answers.append(session.get(f"{url}/files/out.txt", timeout=30))
            answers.append(session.get(f"{url}/files/d/{victim.id}.json", timeout=30))
            if i % 10 == 0:
                answers.append(session.get(url, timeout=30))
    finally:
        (outputs / "stop").write_text("")
    leaked = [r.status_code for r in answers if canary in r.text]
    assert leaked == [], f"{len(leaked)} answers held the other tenant's secret"
    served = [r for r in answers if r.url.endswith("/out.txt") and r.status_code == 200]
    refused = [r for r in answers if r.status_code == 404]
    # the race was really run: the file was served sometimes, refused (a link) other times
    assert served and all(r.content == b"benign\n" for r in served)
    why = {r.json()["detail"].split(":")[0] for r in refused}
    # a link is refused as one; in the moment between the swap's unlink and rename, as
    # gone; a directory the open found a link, swapped back before the refusal was
    # worded, as not a directory
    assert any("is a symlink" in w for w in why), why
    allowed = ("is a symlink", "is not a file of the job", "is not a directory", "is not a regular")
    assert all(any(a in w for a in allowed) for w in why), why
    assert attacker.wait(timeout=120).state is JobState.SUCCEEDED
    victim.cancel()
    assert victim.wait(timeout=120).state.terminal


# Its first placement replaces its own code file by a link to a file of the gateway's
# and waits to be preempted; placed again, it just finishes.
PLANTER = """
import os, sys, time
import air_sdk.runtime as air
import torch.distributed as dist
ctx = air.init()
here = os.path.abspath(__file__)
marker = air.output_dir() / "planted"
first = not marker.exists()
dist.barrier()  # every rank looked before rank 0 plants: all of them know the placement
if first:  # rank 0 plants, and every rank waits to be preempted
    if ctx.rank == 0:
        os.symlink(sys.argv[1], here + ".lnk")
        os.replace(here + ".lnk", here)
        marker.write_text("")
        print("planted", flush=True)
    while not air.should_stop():
        time.sleep(0.05)
    air.exit_stopped()
print("placed again, code is a link:", os.path.islink(here), flush=True)
air.shutdown()
"""

QUICK = """
import time
import air_sdk.runtime as air
air.init()
time.sleep(1)
air.shutdown()
"""


def test_placing_a_job_again_never_writes_its_code_through_a_link_it_planted(
    gateway_process, gateway, members, request
):
    home = gateway_process.log_path.parent
    target = home / "gateway-file.txt"
    target.write_text("the gateway's own\n")
    tenant = members["attacker"]
    low = tenant.submit(
        JobSpec(code=PLANTER, args=[str(target)], resources=Resources(nodes=2), priority="low")
    )
    request.addfinalizer(low.cancel)  # both nodes are free for the next test, whatever happens
    code_file = home / "jobs" / low.id / "code" / "__air_main__.py"
    wait_for(code_file.is_symlink, 180, "the job's link in place of its code")
    # placed again after a preemption (a member may not ask for high priority any more,
    # issue 19 item 10; the operator's job preempts it here, as any higher job would)
    high = gateway.submit(JobSpec(code=QUICK, resources=Resources(nodes=1), priority="high"))
    assert high.wait(timeout=180).state is JobState.SUCCEEDED
    record = low.wait(timeout=240)
    lines = [line.text for line in low.logs()]
    assert target.read_text() == "the gateway's own\n"  # not the job's code
    assert record.state is JobState.SUCCEEDED, (record.state_reason, lines)
    assert len(low.attempts()) == 2  # it was placed again
    assert "placed again, code is a link: False" in lines
    assert not code_file.is_symlink() and code_file.read_text() == PLANTER


# Saves a checkpoint, then swaps its committed `.metadata` for a pickle that creates a
# file when loaded, and fixes the manifest's size and sha256 to match.
POISONER = """
import hashlib, json, os, pickle, sys
import torch
import air_sdk.runtime as air
air.init()
air.checkpoint.save({"model": torch.nn.Linear(2, 2)}, step=1, block=True)
air.checkpoint.wait()
class Boom:
    def __reduce__(self):
        return (open, (sys.argv[1], "w"))
step = os.path.join(os.environ["AIR_CHECKPOINT_DIR"], "step-1")
raw = pickle.dumps(Boom())
with open(os.path.join(step, ".metadata"), "wb") as f:
    f.write(raw)
manifest = json.load(open(os.path.join(step, "manifest.json")))
for entry in manifest["files"]:
    if entry["path"] == ".metadata":
        entry.update(size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
with open(os.path.join(step, "manifest.json"), "w") as f:
    json.dump(manifest, f)
print("poisoned", flush=True)
air.shutdown()
"""


def test_export_never_unpickles_a_job_written_metadata(gateway_process, members, tmp_path):
    import os
    import subprocess
    import sys

    marker = tmp_path / "created-by-the-job-s-pickle"
    tenant = members["attacker"]
    job = tenant.submit(JobSpec(code=POISONER, args=[str(marker)], resources=Resources(nodes=1)))
    record = job.wait(timeout=240)
    lines = [line.text for line in job.logs()]
    assert record.state is JobState.SUCCEEDED and "poisoned" in lines, lines
    assert not marker.exists()
    env = {
        **os.environ,
        "AIR_GATEWAY_URL": gateway_process.url,
        "AIR_TOKEN": members["attacker-token"],
    }
    env.pop("AIR_CONFIG_FILE", None)
    out = tmp_path / "model.safetensors"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "air_sdk.cli.main",
            "checkpoints",
            "export",
            job.id,
            "--to",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert "is not DCP metadata" in said and "io.open" in said, said
    assert not marker.exists() and not out.exists()


# Its first attempt plants the next attempt's directory as a link to one of its own,
# holding the node log as a link to a file of the gateway's, then fails; the second
# attempt just finishes.
LOG_PLANTER = """
import os, sys
import air_sdk.runtime as air
air.init()
attempts = os.path.join(os.path.dirname(os.getcwd()), "attempts")
marker = air.output_dir() / "planted"
if not marker.exists():
    nodes = os.path.join(attempts, "elsewhere", "nodes")
    os.makedirs(nodes)
    os.symlink(sys.argv[1], os.path.join(nodes, os.environ["AIR_NODE_NAME"] + ".log"))
    os.symlink(os.path.join(attempts, "elsewhere"), os.path.join(attempts, "2"))
    marker.write_text("")
    print("planted " + nodes, flush=True)
    sys.exit(3)
print("the second attempt runs", flush=True)
air.shutdown()
"""


def test_the_node_runner_never_appends_its_log_through_a_link_the_job_planted(
    gateway_process, members
):
    home = gateway_process.log_path.parent
    target = home / "gateway-log-target.txt"
    target.write_text("the gateway's own\n")
    job = members["attacker"].submit(
        JobSpec(code=LOG_PLANTER, args=[str(target)], resources=Resources(nodes=1), max_restarts=1)
    )
    record = job.wait(timeout=240)
    lines = [line.text for line in job.logs()]
    assert target.read_text() == "the gateway's own\n"  # no rank output appended
    assert record.state is JobState.SUCCEEDED, (record.state_reason, lines)
    assert any(t.startswith("planted ") for t in lines)
    assert "the second attempt runs" in lines
    second = home / "jobs" / job.id / "attempts" / "2"
    assert not second.is_symlink()
    logs = list((second / "nodes").iterdir())
    assert logs and all(p.is_file() and not p.is_symlink() for p in logs)
    assert "the second attempt runs" in logs[0].read_text()


# Leaves a FIFO where the controller looks for its ranks' exit records, then fails.
FIFO_PLANTER = """
import os, sys
import air_sdk.runtime as air
air.init()
exits = os.path.join(os.path.dirname(os.getcwd()), "attempts", os.environ["AIR_ATTEMPT"], "exits")
os.makedirs(exits, exist_ok=True)
os.mkfifo(os.path.join(exits, "rank-7.json"))
print("fifo planted", flush=True)
sys.exit(3)
"""


def test_a_fifo_among_the_exit_records_does_not_hang_the_job_s_controller(members):
    job = members["attacker"].submit(
        JobSpec(code=FIFO_PLANTER, resources=Resources(nodes=1), max_restarts=0)
    )
    record = job.wait(timeout=180)  # the controller read the FIFO and waited forever
    lines = [line.text for line in job.logs()]
    assert record.state is JobState.FAILED and "fifo planted" in lines, lines
    assert "exit code 3" in (record.state_reason or ""), record.state_reason
