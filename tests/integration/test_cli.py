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


# -- the first hour: what a new user types -----------------------------------------------

MODULE = """
import sys
import air_sdk.runtime as air
ctx = air.init()
print(f"module rank {ctx.rank} args {sys.argv[1:]}", flush=True)
air.shutdown()
"""


def test_follow_streams_rank_0_and_script_args_need_no_double_dash(gateway, workdir):
    src = workdir(TRAIN)
    run = air(gateway, "submit", "train.py", "--nodes", "2", "--follow", "--steps", "5", cwd=src)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "[rank 0] rank 0 trained 5 steps" in lines
    assert not any(line.startswith("[rank 1]") for line in lines)  # --all-ranks shows them
    states = [line.split()[0] for line in lines if line.split()[:1] and line.split()[0].isupper()]
    assert states[-1] == "SUCCEEDED" and len(states) == len(set(states))  # one line each
    # the summary's label column is as wide as its longest label (no steps/second row when
    # the points carry no rate): find the row by its words
    final = next(
        i for i, line in enumerate(lines) if line.split() == ["final", "state", "SUCCEEDED"]
    )
    assert lines.index("[rank 0] rank 0 trained 5 steps") < final
    job_id = lines[0]
    spec = json.loads(air(gateway, "status", job_id, "--json").stdout)["spec"]
    assert spec["args"] == ["--steps", "5"] and spec["resources"]["nodes"] == 2


def test_m_runs_a_module_from_the_workdir(gateway, workdir):
    src = workdir("")
    (src / "pkg").mkdir()
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "train.py").write_text(MODULE)
    run = air(
        gateway,
        "submit",
        "--nodes",
        "2",
        "--follow",
        "--all-ranks",
        "-m",
        "pkg.train",
        "--lr",
        "0.1",
        cwd=src,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[rank 0] module rank 0 args ['--lr', '0.1']" in run.stdout
    assert "[rank 1] module rank 1 args ['--lr', '0.1']" in run.stdout


def test_two_jobs_of_one_workdir_share_its_bytes_and_gc_frees_them(gateway, workdir):
    from air_sdk.runner.retention import disk_usage

    home = gateway.log_path.parent
    src = workdir(TRAIN)
    (src / "weights.bin").write_bytes(os.urandom(4 << 20))
    ids = []
    for _ in range(2):
        run = air(gateway, "submit", "train.py", "--follow", "--steps", "1", cwd=src)
        assert run.returncode == 0, run.stdout + run.stderr
        ids.append(run.stdout.splitlines()[0])
    a, b = (home / "jobs" / job_id / "code" / "weights.bin" for job_id in ids)
    assert a.read_bytes() == b.read_bytes() and a.stat().st_ino == b.stat().st_ino
    assert disk_usage([home / "jobs" / i for i in ids]) < 5 << 20  # once, not twice

    dry = air(gateway, "gc", "--older-than", "0", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for job_id in ids:
        assert f"would delete the files of {job_id}" in dry.stdout
    assert "would free" in dry.stdout and (home / "jobs" / ids[0]).is_dir()
    # a committed checkpoint under a job is the user's work: it stays unless named
    kept = home / "jobs" / ids[1] / "checkpoints" / "step-1"
    kept.mkdir(parents=True)
    (kept / "model.pt").write_bytes(b"weights")
    freed = air(gateway, "gc", "--older-than", "0")
    assert freed.returncode == 0, freed.stdout + freed.stderr
    assert not (home / "jobs" / ids[0]).exists()
    assert not (home / "jobs" / ids[1] / "code").exists()
    assert (kept / "model.pt").read_bytes() == b"weights"
    again = air(gateway, "gc", "--older-than", "0", "--include-checkpoints")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"deleted the files of {ids[1]}" in again.stdout
    assert not (home / "jobs" / ids[1]).exists()
    logs = air(gateway, "logs", ids[0])  # the job's record and logs outlive its files
    assert "[rank 0] rank 0 trained 1 steps" in logs.stdout


def test_start_on_a_taken_default_port_moves_on_and_says_so(tmp_path):
    import socket

    holder = socket.socket()
    try:
        try:
            holder.bind(("127.0.0.1", 8470))
            holder.listen()
        except OSError:
            pass  # someone else holds 8470 already: just as taken
        config = tmp_path / "config.toml"
        env = {**os.environ, "AIR_CONFIG_FILE": str(config), "AIR_HOME": str(tmp_path / "home")}
        for name in ("AIR_GATEWAY_URL", "AIR_TOKEN", "AIR_GATEWAY_PORT", "AIR_GATEWAY_OPTIONS"):
            env.pop(name, None)
        start = subprocess.run(
            [*AIR, "gateway", "start", "--detach", "--nodes", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        try:
            assert start.returncode == 0, start.stdout + start.stderr
            assert (
                "port 8470 is taken by " in start.stderr
                and " instead (choose one with --port)" in start.stderr
            )
            moved = int(start.stderr.split("using ")[1].split()[0])
            assert moved != 8470 and f"gateway running at http://127.0.0.1:{moved}" in start.stdout
            assert f'gateway_url = "http://127.0.0.1:{moved}"' in config.read_text()
            status = subprocess.run(
                [*AIR, "jobs"], env=env, capture_output=True, text=True, timeout=60
            )
            assert status.returncode == 0, status.stdout + status.stderr  # the config works
        finally:
            subprocess.run([*AIR, "gateway", "stop"], env=env, capture_output=True, timeout=60)
    finally:
        holder.close()
