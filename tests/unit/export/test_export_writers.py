"""The export worker over each tracker's real library: what it writes is read back with
that library's own reader (TensorBoard's EventAccumulator, MlflowClient, W&B's
transaction log)."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import pytest
import wandbfile

from air_sdk.export.worker import serve
from air_sdk.schema import CheckpointCommit, Event, MetricPoint, MetricsBatch

COMMIT = CheckpointCommit(
    step=3, path="/ck/3", world_size=2, size_bytes=10, num_files=2, blocked_s=0.1, durable_s=0.2
)
JOB = {"job_id": "train-0a1b2c3d", "name": "train", "tenant": "acme", "params": {"nodes": "2"}}


def _events() -> list[Event]:
    def points(rank: int, steps: range, scale: float) -> MetricsBatch:
        return MetricsBatch(
            points=[MetricPoint(step=s, ts=1000.0 + s, values={"loss": scale / s}) for s in steps]
        )

    return [
        Event.of(points(0, range(1, 4), 1.0), seq=5, job_id="j", ts=1.0, rank=0),
        Event.of(points(1, range(1, 4), 7.0), seq=6, job_id="j", ts=1.0, rank=1),  # not rank 0
        Event.of(COMMIT, seq=7, job_id="j", ts=1003.5, rank=0),
        Event.of(points(0, range(4, 6), 1.0), seq=8, job_id="j", ts=2.0, rank=0),
    ]


def _run(to: str, directory: Path, resume: dict[str, str] | None = None) -> list[dict]:
    start = {"to": to, "dest": None, "dir": str(directory), "resume": resume or {}, "job": JOB}
    body = ",".join(e.model_dump_json() for e in _events())
    lines = [
        json.dumps({"start": start}),
        '{"events": [' + body + "]}",
        json.dumps({"end": {"state": "SUCCEEDED", "reason": "every rank exited 0"}}),
    ]
    out = io.StringIO()
    assert serve(io.StringIO("\n".join(lines) + "\n"), out) == 0, out.getvalue()
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answers[1] == {"seq": 8} and answers[2] == {"ended": True}
    return answers


WANT = [(s, 1.0 / s) for s in range(1, 6)]


def test_tensorboard_event_files_hold_rank_0s_series_and_the_checkpoints(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    answers = _run("tensorboard", tmp_path)
    assert answers[0]["started"]["location"] == str(tmp_path)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, pytest.approx(e.value)) for e in acc.Scalars("loss")] == WANT
    assert [e.step for e in acc.Scalars("air/checkpoint_step")] == [3]


def test_mlflow_run_holds_the_series_the_checkpoint_and_the_final_status(tmp_path):
    from mlflow.tracking import MlflowClient

    answers = _run("mlflow", tmp_path)
    uri = answers[0]["started"]["location"]
    assert uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("air").experiment_id])
    assert run.info.run_name == JOB["job_id"] and run.info.status == "FINISHED"
    assert run.data.tags["air.state"] == "SUCCEEDED"
    assert run.data.tags["air.last_checkpoint"] == "/ck/3"
    assert run.data.params == {"nodes": "2"}
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, pytest.approx(v)) for s, v in WANT]
    assert answers[0]["started"]["resume"] == {"run_id": run.info.run_id}


def test_mlflow_writes_on_into_the_same_run_when_made_again(tmp_path):
    from mlflow.tracking import MlflowClient

    first = _run("mlflow", tmp_path)[0]["started"]
    _run("mlflow", tmp_path, resume=first["resume"])  # a gateway that restarted
    client = MlflowClient(tracking_uri=first["location"])
    runs = client.search_runs([client.get_experiment_by_name("air").experiment_id])
    assert [r.info.run_id for r in runs] == [first["resume"]["run_id"]]


def test_wandb_offline_run_holds_the_series_and_the_final_state(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # wandb writes its settings under HOME
    answers = _run("wandb", tmp_path)
    assert answers[0]["started"]["location"] == str(tmp_path / "wandb")
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [r for r in wandbfile.history(log) if "loss" in r]
    assert [(r["air/step"], pytest.approx(r["loss"])) for r in rows] == WANT
    assert [r["air/step"] for r in wandbfile.history(log) if "air/checkpoint_step" in r] == [3]
    summary = wandbfile.summary(log)
    assert summary["air/state"] == "SUCCEEDED" and summary["air/last_checkpoint"] == "/ck/3"


def test_an_offline_wandb_export_starts_no_error_reporting_to_wandb(tmp_path, monkeypatch):
    # W&B's own error reporting exports over HTTPS to W&B from threads that every
    # process forked later starts again: off unless the operator turned it on.
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_ERROR_REPORTING", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    _run("wandb", tmp_path)
    assert os.environ["WANDB_ERROR_REPORTING"] == "false"
    assert [t.name for t in threading.enumerate() if t.name.startswith("Otel")] == []
    # an operator's own choice stands
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "true")
    _run("wandb", tmp_path / "again")
    assert os.environ["WANDB_ERROR_REPORTING"] == "true"


def test_a_bad_message_is_answered_with_an_error_and_the_worker_stops(tmp_path):
    out = io.StringIO()
    assert serve(io.StringIO('{"events": []}\n'), out) == 1
    assert json.loads(out.getvalue()) == {
        "error": "RuntimeError: the first message must be `start`"
    }
