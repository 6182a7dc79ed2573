"""One writer per tracker, each over the tracker's own client library (imported when the
writer is made, inside the export worker process, never in the gateway).

Every writer takes the same calls, in event-log order: `points` (rank 0's `air.log`
points), `checkpoint` (a committed checkpoint) and `finish` (the final state). A writer
made again with the `resume` it returned writes on into the same run: a gateway that
restarted carries on where it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from air_sdk.schema.events import MetricPoint

__all__ = ["JobInfo", "Writer", "make_writer"]

#: what MLflow's log_batch takes in one call
MLFLOW_BATCH = 1000
#: final job states as MLflow run statuses
MLFLOW_STATUS = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "CANCELLED": "KILLED"}


@dataclass(frozen=True)
class JobInfo:
    """What a tracker's run is named and tagged with."""

    job_id: str
    name: str
    tenant: str
    params: dict[str, str] = field(default_factory=dict)


class Writer(Protocol):
    #: where the data went, for people: a path or a URI
    location: str
    #: what a writer made again needs to write on into the same run
    resume: dict[str, str]

    def points(self, points: list[MetricPoint]) -> None: ...

    def checkpoint(self, step: int, path: str, ts: float) -> None: ...

    def finish(self, state: str, reason: str) -> None: ...


def make_writer(
    to: str, dest: str | None, job: JobInfo, directory: Path, resume: dict[str, str]
) -> Writer:
    """The writer for tracker `to`, keeping its files (if any) under `directory`."""
    if to == "tensorboard":
        return TensorBoardWriter(directory)
    if to == "mlflow":
        return MlflowWriter(dest, job, directory, resume)
    if to == "wandb":
        return WandbWriter(dest, job, directory, resume)
    raise ValueError(f"unknown tracker {to!r}")


def _finite(values: dict[str, float]) -> dict[str, float]:
    # MLflow refuses NaN in some stores and W&B shows it as a gap: leave them out (the
    # gateway's own chart marks them)
    return {k: v for k, v in values.items() if math.isfinite(v)}


class TensorBoardWriter:
    """Event files under `directory`, written by torch's `SummaryWriter` (what
    `tensorboard --logdir` and `EventAccumulator` read)."""

    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        directory.mkdir(parents=True, exist_ok=True)
        self.location = str(directory)
        self.resume: dict[str, str] = {}
        self._writer = SummaryWriter(log_dir=str(directory), flush_secs=5)

    def points(self, points: list[MetricPoint]) -> None:
        for p in points:
            for name, value in _finite(p.values).items():
                self._writer.add_scalar(name, value, global_step=p.step, walltime=p.ts)
        self._writer.flush()

    def checkpoint(self, step: int, path: str, ts: float) -> None:
        self._writer.add_scalar("air/checkpoint_step", step, global_step=step, walltime=ts)
        self._writer.add_text("air/checkpoints", f"step {step}: {path}", step, walltime=ts)

    def finish(self, state: str, reason: str) -> None:
        self._writer.add_text("air/final_state", f"{state}: {reason}" if reason else state)
        self._writer.close()


class MlflowWriter:
    """One MLflow run per job: metrics by step, a tag and a metric per checkpoint, the
    run's status from the final state. Without a tracking URI the store is a SQLite
    file under `directory` (`mlflow ui --backend-store-uri sqlite:///...` opens it)."""

    def __init__(
        self, uri: str | None, job: JobInfo, directory: Path, resume: dict[str, str]
    ) -> None:
        from mlflow.tracking import MlflowClient

        directory.mkdir(parents=True, exist_ok=True)
        if uri is None:
            uri = f"sqlite:///{directory / 'mlflow.db'}"
        self.location = uri
        self._client = MlflowClient(tracking_uri=uri)
        run_id = resume.get("run_id")
        if run_id is None:
            experiment = self._client.get_experiment_by_name("air")
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self._client.create_experiment(
                    "air", artifact_location=(directory / "artifacts").as_uri()
                )
            )
            run = self._client.create_run(
                experiment_id,
                run_name=job.job_id,
                tags={"air.job_id": job.job_id, "air.job_name": job.name, "air.tenant": job.tenant},
            )
            run_id = run.info.run_id
            for key, value in job.params.items():
                self._client.log_param(run_id, key, value)
        self._run_id = run_id
        self.resume = {"run_id": run_id}

    def points(self, points: list[MetricPoint]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(name, value, int(p.ts * 1000), p.step)
            for p in points
            for name, value in _finite(p.values).items()
        ]
        for start in range(0, len(metrics), MLFLOW_BATCH):
            self._client.log_batch(self._run_id, metrics=metrics[start : start + MLFLOW_BATCH])

    def checkpoint(self, step: int, path: str, ts: float) -> None:
        self._client.log_metric(self._run_id, "air.checkpoint_step", step, int(ts * 1000), step)
        self._client.set_tag(self._run_id, "air.last_checkpoint", path)

    def finish(self, state: str, reason: str) -> None:
        self._client.set_tag(self._run_id, "air.state", state)
        if reason:
            self._client.set_tag(self._run_id, "air.state_reason", reason[:5000])
        self._client.set_terminated(self._run_id, MLFLOW_STATUS.get(state, "FAILED"))


class WandbWriter:
    """One W&B run per job (its id derived from the job's, so a restarted export writes
    on into it). Offline files under `directory` unless the job gave WANDB_API_KEY
    (`wandb sync DIR` uploads offline runs later). Points are logged against an
    `air/step` axis, so a job that resumed from an earlier checkpoint and logs a step
    again is drawn, not dropped (W&B's own step must only grow)."""

    def __init__(
        self, project: str | None, job: JobInfo, directory: Path, resume: dict[str, str]
    ) -> None:
        import os

        # W&B's own error reporting (OpenTelemetry over HTTPS to W&B, with export
        # threads that every process forked from this one starts again) is off unless
        # the operator turned it on: an offline export sends nothing anywhere, and
        # DataLoader workers forked beside it crashed in those threads.
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        online = bool(os.environ.get("WANDB_API_KEY"))
        run_id = resume.get("run_id") or job.job_id.replace(".", "-")
        self._run: Any = wandb.init(
            mode="online" if online else "offline",
            dir=str(directory),
            project=project or "air",
            name=job.job_id,
            id=run_id,
            resume="allow",
            config={**job.params, "air.tenant": job.tenant, "air.job_name": job.name},
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self._run.define_metric("air/step")
        self._run.define_metric("*", step_metric="air/step")
        self.location = self._run.url if online and self._run.url else str(directory / "wandb")
        self.resume = {"run_id": run_id}

    def points(self, points: list[MetricPoint]) -> None:
        for p in points:
            values = _finite(p.values)
            if values:
                self._run.log({**values, "air/step": p.step})

    def checkpoint(self, step: int, path: str, ts: float) -> None:
        self._run.log({"air/checkpoint_step": step, "air/step": step})
        self._run.summary["air/last_checkpoint"] = path

    def finish(self, state: str, reason: str) -> None:
        self._run.summary["air/state"] = state
        if reason:
            self._run.summary["air/state_reason"] = reason[:5000]
        self._run.finish(exit_code=0 if state == "SUCCEEDED" else 1)
        import wandb

        # finish() can return before W&B's service process has written the run's file:
        # tear the service down, which waits for it
        wandb.teardown()
