"""`air submit --export` through a real gateway: a 2-node job's metrics, checkpoint and
final state reach MLflow, W&B (offline) and TensorBoard, read back with each library's
own reader; `air status` says where each went; a tracking server the operator did not
allow is refused at submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import wandbfile

from air_sdk.client import Client

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]

TRAIN = """
import torch
import air_sdk.runtime as air

ctx = air.init()
state = {"w": torch.zeros(2)}
for step in range(1, 7):
    air.log(step=step, loss=(1.0 if ctx.rank == 0 else 5.0) / step)
    if step == 4:
        air.checkpoint.save(state, step=step)
air.checkpoint.wait()
air.shutdown()
"""


def air(gateway, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIR_GATEWAY_URL": gateway.url, "AIR_TOKEN": gateway.token}
    env.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [*AIR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _exports_done(client: Client, job_id: str, timeout_s: float = 300) -> dict:
    job = client.job(job_id)
    wanted = {t.to for t in job.record().spec.export}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exports = job.snapshot().exports
        if set(exports) == wanted and all(e.state != "running" for e in exports.values()):
            return exports
        time.sleep(1)
    raise AssertionError(f"exports still running after {timeout_s} s: {exports}")


WANT = [(s, pytest.approx(1.0 / s)) for s in range(1, 7)]


def test_a_jobs_metrics_reach_mlflow_wandb_and_tensorboard(gateway_process, workdir):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    src = workdir(TRAIN)
    run = air(
        gateway_process,
        "submit",
        "train.py",
        "--nodes",
        "2",
        "--export",
        "mlflow,tensorboard",
        "--export",
        "wandb=air-tests",
        "--follow",
        cwd=src,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.splitlines()[0]
    client = Client(gateway_process.url, gateway_process.token)
    exports = _exports_done(client, job_id)
    assert {to: e.state for to, e in exports.items()} == dict.fromkeys(
        ("mlflow", "tensorboard", "wandb"), "done"
    ), exports

    acc = EventAccumulator(exports["tensorboard"].location)
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == WANT  # rank 0's series
    assert [e.step for e in acc.Scalars("air/checkpoint_step")] == [4]

    ml = MlflowClient(tracking_uri=exports["mlflow"].location)
    (found,) = ml.search_runs([ml.get_experiment_by_name("air").experiment_id])
    assert found.info.run_name == job_id and found.info.status == "FINISHED"
    assert found.data.tags["air.state"] == "SUCCEEDED"
    assert found.data.params["nodes"] == "2"
    loss = sorted((m.step, m.value) for m in ml.get_metric_history(found.info.run_id, "loss"))
    assert loss == WANT

    (log,) = Path(exports["wandb"].location).glob("offline-run-*/run-*.wandb")
    rows = [r for r in wandbfile.history(log) if "loss" in r]
    assert [(r["air/step"], r["loss"]) for r in rows] == WANT
    assert wandbfile.summary(log)["air/state"] == "SUCCEEDED"

    status = air(gateway_process, "status", job_id)
    assert f"export to tensorboard: done, {exports['tensorboard'].location}" in status.stdout
    as_json = json.loads(air(gateway_process, "status", job_id, "--json").stdout)
    assert as_json["exports"]["mlflow"]["state"] == "done"


def test_a_tracking_server_the_operator_did_not_allow_is_refused_at_submit(
    gateway_process, workdir
):
    src = workdir(TRAIN)
    before = json.loads(air(gateway_process, "jobs", "--json").stdout)
    run = air(
        gateway_process, "submit", "train.py", "--export", "mlflow=http://127.0.0.1:9", cwd=src
    )
    assert run.returncode != 0
    said = run.stdout + run.stderr
    assert "--export mlflow=http://127.0.0.1:9" in said
    assert "allows no MLflow tracking server (air gateway start --export-uri PREFIX)" in said
    run = air(gateway_process, "submit", "train.py", "--export", "tensorbord", cwd=src)
    assert run.returncode == 2 and "unknown tracker 'tensorbord'" in run.stdout + run.stderr
    assert json.loads(air(gateway_process, "jobs", "--json").stdout) == before
