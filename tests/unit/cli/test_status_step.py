"""`air status` tells the job's latest step: a `step` field in `--json` (null before the
script logs one) and `step N` in the human view."""

from __future__ import annotations

import json

from clitest import FakeGateway, flat, invoke

from air_sdk.schema import JobState


def test_status_json_has_the_latest_logged_step(gateway: FakeGateway) -> None:
    gateway.add_job("train-1", JobState.RUNNING)
    for step in (1, 2, 7):
        points = [{"step": step, "ts": float(step), "values": {"loss": 1.0 / step}}]
        gateway.emit("train-1", "metrics", rank=0, points=points)

    result = invoke("status", "train-1", "--json")

    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["step"] == 7
    assert status["id"] == "train-1" and status["state"] == "RUNNING"  # the record as before


def test_status_json_step_is_null_before_any_log(gateway: FakeGateway) -> None:
    gateway.add_job("train-2", JobState.QUEUED)

    status = json.loads(invoke("status", "train-2", "--json").stdout)

    assert status["step"] is None


def test_human_status_shows_the_step(gateway: FakeGateway) -> None:
    gateway.add_job("train-3", JobState.RUNNING)
    gateway.run_to_end("train-3", JobState.SUCCEEDED, steps=5)

    result = invoke("status", "train-3")

    assert result.exit_code == 0, result.output
    assert "step 5 " in flat(result.stdout)
