"""A job's durable outputs and the shell variables it asked for, through a real gateway
and the `air` command: a job writes under AIR_OUTPUT_DIR, `air outputs` lists it,
`--download` fetches the same bytes, `air gc` keeps them (and deletes the relative
path the job wrote into its code copy); `--env-from-shell` reaches every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]

WRITE = """
import hashlib, os, sys
import air_sdk.runtime as air
ctx = air.init()
out = air.output_dir()
data = hashlib.sha256(b"seed").digest() * 65536  # 2 MiB, the same every run
if ctx.rank == 0:
    (out / "model").mkdir(exist_ok=True)
    (out / "model" / "weights.bin").write_bytes(data)
os.makedirs("runs/x", exist_ok=True)  # relative: lands in the job's code copy
with open("runs/x/rel.txt", "w") as f:
    f.write("lost to air gc")
(out / f"rank-{ctx.rank}.txt").write_text(os.environ["AIR_OUTPUT_DIR"])
due = [s for s in range(1, 11) if air.checkpoint.due(s)]
secret = os.environ.get("MY_API_TOKEN")
print(f"rank {ctx.rank} due {due} token {secret} {secret == 's3cr3t-value'}"
      f" seed {os.environ.get('SEED')} home {os.environ.get('HOME_NOT_ASKED')}", flush=True)
air.shutdown()
"""


def air(gateway, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    full = {**os.environ, "AIR_GATEWAY_URL": gateway.url, "AIR_TOKEN": gateway.token, **(env or {})}
    full.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [*AIR, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=240
    )


def test_outputs_are_listed_downloaded_and_kept_by_gc(gateway_process, workdir, tmp_path):
    gw, home = gateway_process, gateway_process.log_path.parent
    src = workdir(WRITE)
    run = air(gw, "submit", "train.py", "--nodes", "2", "--follow", cwd=src)
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.splitlines()[0]
    outputs = home / "outputs" / job_id
    assert (outputs / "rank-1.txt").read_text() == str(outputs)
    assert (home / "jobs" / job_id / "code" / "runs" / "x" / "rel.txt").is_file()

    listed = air(gw, "outputs", job_id, "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    files = {f["path"]: f["bytes"] for f in json.loads(listed.stdout)["files"]}
    assert files == {
        "model/weights.bin": 2 << 20,
        "rank-0.txt": len(str(outputs)),
        "rank-1.txt": len(str(outputs)),
    }
    table = air(gw, "outputs", job_id)
    assert "model/weights.bin" in table.stdout and "3 files" in table.stdout

    fetched = air(gw, "outputs", job_id, "--download", str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert "downloaded 3 files" in fetched.stdout
    for relative in files:
        assert (tmp_path / "got" / relative).read_bytes() == (outputs / relative).read_bytes()

    gc = air(gw, "gc", "--older-than", "0")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert f"deleted the files of {job_id}" in gc.stdout
    assert not (home / "jobs" / job_id).exists()  # the code copy and runs/x/rel.txt went
    again = air(gw, "outputs", job_id, "--json")
    assert {f["path"] for f in json.loads(again.stdout)["files"]} == set(files)
    assert (outputs / "model" / "weights.bin").stat().st_size == 2 << 20


def test_env_from_shell_and_checkpoint_every_reach_every_rank(gateway_process, workdir):
    gw = gateway_process
    src = workdir(WRITE)
    shell = {"MY_API_TOKEN": "s3cr3t-value", "SEED": "7", "HOME_NOT_ASKED": "here"}
    run = air(
        gw,
        "submit",
        "train.py",
        "--nodes",
        "2",
        "--env-from-shell",
        "MY_API_TOKEN,SEED",
        "--checkpoint-every",
        "4",
        "--follow",
        cwd=src,
        env=shell,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.splitlines()[0]
    logs = air(gw, "logs", job_id).stdout
    for rank in (0, 1):
        # the secret reached the rank; the log shows it redacted, as any --env secret
        assert f"rank {rank} due [4, 8] token " in logs
        assert "seed 7 home None" in logs
    assert "s3cr3t-value" not in logs
    status = json.loads(air(gw, "status", job_id, "--json").stdout)
    assert status["spec"]["env"]["SEED"] == "7"
    assert status["spec"]["env"]["MY_API_TOKEN"] != "s3cr3t-value"  # redacted
    assert status["spec"]["checkpoint"]["every_steps"] == 4

    missing = air(gw, "submit", "train.py", "--env-from-shell", "NOT_IN_SHELL_XYZ", cwd=src)
    assert missing.returncode == 2
    assert "NOT_IN_SHELL_XYZ is not set in this shell" in missing.stderr
