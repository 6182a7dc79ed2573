"""The first hour on a default gateway of this machine (2 virtual nodes sharing its
cores), through the `air` command as a new user types it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from airtest import stop_gateway_and_its_jobs

from air_sdk.gateway.server import GatewayOptions, GatewayProcess, start_detached
from air_sdk.runner.backends.local import free_port

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]
CORES = os.cpu_count() or 1

TRAIN = """
import sys
import air_sdk.runtime as air
ctx = air.init()
steps = int(sys.argv[sys.argv.index("--steps") + 1])
for step in range(steps):  # 0-based, as most loops are
    air.log(step=step, loss=1.0 / (step + 1))
air.shutdown()
"""


@pytest.fixture(scope="module")
def default_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """`air gateway start --nodes 2` as a newcomer runs it: each virtual node offers every
    core, and the nodes share them (no --slots-per-node, no --oversubscribe)."""
    home = tmp_path_factory.mktemp("air-home")
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        write_client_config=False,
        sandbox_binds=(tmp_path_factory.getbasetemp(),),
    )
    gw = start_detached(opts)
    yield gw
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


def air(gw: GatewayProcess, *args: str, cwd: Path | None = None, timeout: float = 180):
    env = {**os.environ, "AIR_GATEWAY_URL": gw.url, "AIR_TOKEN": gw.token}
    env.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [*AIR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def jobs(gw: GatewayProcess) -> list[dict]:
    return json.loads(air(gw, "jobs", "--json").stdout)


def test_the_same_ranks_on_the_same_cores_are_refused_at_submit_alike(default_gateway, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    before = jobs(default_gateway)
    said = []
    for nodes, procs in ((2, CORES), (1, 2 * CORES)):  # 2 x 2 and 1 x 4 on 2 cores
        run = air(
            default_gateway,
            "submit",
            "train.py",
            "--nodes",
            str(nodes),
            "--procs-per-node",
            str(procs),
            cwd=tmp_path,
        )
        assert run.returncode == 1, run.stdout + run.stderr  # the gateway refused it
        said.append(run.stderr)
    assert said[0] == said[1]
    assert (
        f"the job runs {2 * CORES} ranks at once; this gateway runs at most {CORES} rank"
        in (said[0])
    )
    assert "--oversubscribe" in said[0]
    assert jobs(default_gateway) == before  # refused, not accepted and then FAILED


def test_a_thousand_nodes_are_told_what_fits_not_to_restart_with_them(default_gateway, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    run = air(default_gateway, "submit", "train.py", "--nodes", "1000", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr  # the gateway refused it
    assert "the job runs 1000 ranks at once" in run.stderr
    assert f"2 nodes x {CORES // 2} rank" in run.stderr  # what this gateway places
    assert "--nodes 1000" not in run.stderr


def test_the_follow_summary_counts_the_steps_of_a_zero_based_loop(default_gateway, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    run = air(default_gateway, "submit", "train.py", "--follow", "--", "--steps", "7", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line.split() for line in run.stdout.splitlines()]
    assert ["steps", "7"] in lines  # steps 0..6 are 7 steps, not "steps 6"


SLOW = """
import time
import air_sdk.runtime as air
air.init()
for step in range(400):
    air.log(step=step, loss=1.0)
    time.sleep(0.05)
air.shutdown()
"""


def test_a_second_client_attaching_to_a_running_job_sees_its_total(default_gateway, tmp_path):
    from airtest import wait_for

    from air_sdk.client import Client
    from air_sdk.notebook.figures import progress_text

    (tmp_path / "slow.py").write_text(SLOW)
    run = air(default_gateway, "submit", "slow.py", "--total-steps", "400", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.split()[-1]
    elsewhere = Client(default_gateway.url, default_gateway.token).job(job_id)
    try:
        snapshot = wait_for(
            lambda: (s := elsewhere.snapshot()).steps_done and s, 120, "a logged step"
        )
        assert snapshot.total_steps == 400
        assert " / 400 (" in progress_text(snapshot)
        status = air(default_gateway, "status", job_id)
        assert "/400" in status.stdout, status.stdout
    finally:
        air(default_gateway, "cancel", job_id)


CHECKPOINTED = """
import os
import air_sdk.runtime as air
air.init()
where = os.path.join(os.environ["AIR_CHECKPOINT_DIR"], "run-of-a-long-name", "step-3")
os.makedirs(where, exist_ok=True)
with open(os.path.join(where, "model.bin"), "wb") as f:
    f.write(b"w" * 64)
air.log(step=3, loss=0.5)
air.checkpoint.record(where, step=3)
air.shutdown()
"""


def test_checkpoints_say_when_they_were_saved_and_the_monitor_a_short_path(
    default_gateway, tmp_path
):
    import time

    from air_sdk.client import Client
    from air_sdk.notebook.snapshot_html import checkpoints_html
    from air_sdk.text import clock

    (tmp_path / "ck.py").write_text(CHECKPOINTED)
    before = time.time()
    run = air(default_gateway, "submit", "ck.py", "--follow", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = json.loads(air(default_gateway, "jobs", "--json").stdout)[0]["id"]

    listed = air(default_gateway, "checkpoints", job_id)
    assert listed.returncode == 0, listed.stderr
    assert "SAVED" in listed.stdout and " s ago)" in listed.stdout, listed.stdout
    commit = Client(default_gateway.url, default_gateway.token).job(job_id).checkpoints().commits[0]
    assert commit.committed_at is not None and before <= commit.committed_at <= time.time()

    snapshot = Client(default_gateway.url, default_gateway.token).job(job_id).snapshot()
    table = checkpoints_html(snapshot)
    assert f">{clock(commit.committed_at)}<" in table  # the saved column
    assert f'title="{commit.path}">…/run-of-a-long-name/step-3<' in table  # short, whole on hover


def test_submit_on_a_terminal_shows_the_scan_of_a_large_tree(default_gateway, tmp_path):
    import pty

    (tmp_path / "train.py").write_text("print('hi')\n")
    for i in range(1500):
        folder = tmp_path / "data" / f"part-{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"row-{i:05d}.txt").write_text(f"row {i}\n")
    env = {**os.environ, "AIR_GATEWAY_URL": default_gateway.url, "AIR_TOKEN": default_gateway.token}
    env.update(TERM="xterm-256color", AIR_BUNDLE_INDEX="0", COLUMNS="120")
    env.pop("AIR_CONFIG_FILE", None)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*AIR, "submit", "train.py"], cwd=tmp_path, env=env, stdout=follower, stderr=follower
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=120) == 0, seen.decode(errors="replace")
    assert b"scanning " in seen and b"1,501 files" in seen, seen.decode(errors="replace")

    piped = air(default_gateway, "submit", "train.py", cwd=tmp_path)
    assert piped.returncode == 0 and "scanning" not in piped.stdout + piped.stderr
