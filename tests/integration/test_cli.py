"""The `air` command against a real gateway, as a user types it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]

TRAIN = """
import sys
import air_sdk.runtime as air
ctx = air.init()
steps = int(sys.argv[sys.argv.index("--steps") + 1])
for step in range(1, steps + 1):
    air.log(step=step, loss=1.0 / step)
print(f"rank {ctx.rank} trained {steps} steps", flush=True)
if "--fail" in sys.argv and ctx.rank == 1:
    sys.exit(4)
air.shutdown()
"""


@pytest.fixture
def gateway(gateway_process):
    return gateway_process


def air(gateway, *args: str, cwd: Path | None = None, timeout: float = 180):
    env = {**os.environ, "AIR_GATEWAY_URL": gateway.url, "AIR_TOKEN": gateway.token}
    env.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [*AIR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_submit_follow_status_logs_metrics(gateway, workdir):
    src = workdir(TRAIN)
    run = air(
        gateway,
        "submit",
        "train.py",
        "--nodes",
        "2",
        "--name",
        "cli",
        "--follow",
        "--",
        "--steps",
        "20",
        cwd=src,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCEEDED" in run.stdout
    job_id = json.loads(air(gateway, "jobs", "--json").stdout)[0]["id"]

    status = json.loads(air(gateway, "status", job_id, "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["spec"]["resources"]["nodes"] == 2

    logs = air(gateway, "logs", job_id, "--rank", "1").stdout
    assert "[rank 1] rank 1 trained 20 steps" in logs
    assert "rank 0 trained" not in logs

    metrics = air(gateway, "metrics", job_id, "--name", "loss", "--all", "--json")
    rows = json.loads(metrics.stdout)
    assert {r["step"] for r in rows if r["rank"] == 0} == set(range(1, 21))


def test_failed_job_status_json_names_rank_and_exit_code(gateway, workdir):
    src = workdir(TRAIN)
    run = air(
        gateway,
        "submit",
        "train.py",
        "--nodes",
        "2",
        "--follow",
        "--",
        "--steps",
        "5",
        "--fail",
        cwd=src,
    )
    assert run.returncode == 1
    job_id = json.loads(air(gateway, "jobs", "--json").stdout)[0]["id"]
    status = json.loads(air(gateway, "status", job_id, "--json").stdout)
    assert status["state"] == "FAILED"
    assert status["failure"]["rank"] == 1 and status["failure"]["exit_code"] == 4
    text = air(gateway, "status", job_id).stdout
    assert "rank 1" in text and "4" in text


def test_bad_input_is_a_clear_error_and_submits_nothing(gateway, workdir):
    src = workdir(TRAIN)
    before = json.loads(air(gateway, "jobs", "--json").stdout)
    run = air(gateway, "submit", "train.py", "--nodes", "0", cwd=src)
    assert run.returncode == 2 and "nodes" in run.stderr + run.stdout
    run = air(gateway, "submit", "train.py", "--nodes", "5", cwd=src)
    assert run.returncode != 0 and "lower --nodes" in run.stderr + run.stdout
    assert json.loads(air(gateway, "jobs", "--json").stdout) == before
