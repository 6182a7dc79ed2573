"""The gateway's limits, streams and metric values against a real gateway: what a
diverging job shows, what half-open connections and stream floods leave working."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air_sdk.notebook.chart import PNG_MAGIC, render_chart_png
from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]

DIVERGING = """
import air_sdk.runtime as air
air.init()
air.log(step=1, loss=2.0, grad_norm=1.0)
air.log(step=2, loss=float("nan"), grad_norm=float("inf"))
air.log(step=3, loss=float("-inf"), grad_norm=0.5)
air.log(step=4, loss=float("nan"), grad_norm=0.25)
air.shutdown()
"""


def air(url: str, token: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIR_GATEWAY_URL": url, "AIR_TOKEN": token}
    env.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [*AIR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def test_a_diverging_loss_shows_as_nan_and_inf(gateway, gateway_process, workdir):
    job = gateway.submit_script(workdir(DIVERGING) / "train.py", nodes=1, name="diverge")
    record = job.wait(timeout=120)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())

    snap = job.snapshot()
    assert math.isnan(snap.latest["loss"]) and snap.latest["grad_norm"] == 0.25
    by_step = dict(snap.series["loss"])
    assert by_step[1] == 2.0 and math.isnan(by_step[2]) and by_step[3] == -math.inf
    assert dict(snap.series["grad_norm"])[2] == math.inf
    png = render_chart_png(snap, "loss")
    assert png is not None and png.startswith(PNG_MAGIC)

    url, token = gateway_process.url, gateway_process.token
    status = air(url, token, "status", job.id)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "loss nan" in status.stdout, status.stdout
    metrics = air(url, token, "metrics", job.id, "--all")
    assert metrics.returncode == 0, metrics.stdout + metrics.stderr
    cells = metrics.stdout.split()
    assert "nan" in cells and "inf" in cells and "-inf" in cells, metrics.stdout
    rows = json.loads(air(url, token, "metrics", job.id, "--all", "--json").stdout)
    assert [r["values"]["loss"] for r in rows] == [2.0, "NaN", "-Infinity", "NaN"]
