"""ExportService over a real store and real worker processes: it follows a job's
events to the end, says where the data went, gives a failing tracker three tries
before reporting it, hands a worker only that job's credentials for that tracker, and
exports to each tracker of a job on its own, so one that hangs delays no other."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from air_sdk.export.service import ExportService
from air_sdk.schema import (
    EventType,
    ExportStatus,
    JobSpec,
    JobState,
    MetricPoint,
    MetricsBatch,
)
from air_sdk.store import SqliteStore

pytestmark = pytest.mark.slow  # each worker imports a tracker's library


def _job(store: SqliteStore, **spec: object) -> str:
    job, _ = store.create_job(JobSpec(entrypoint="t.py", **spec), tenant="default")
    for state in (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING):
        store.transition(job.id, state)
    return job.id


def _statuses(store: SqliteStore, job_id: str) -> list[ExportStatus]:
    return [
        e.payload_as(ExportStatus)
        for e in store.read_events(job_id, types=(EventType.EXPORT,), limit=100)
    ]


def _wait(predicate, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_a_job_is_followed_to_its_end_and_the_export_says_where(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = SqliteStore(tmp_path / "air.db")
    job_id = _job(store, export=["tensorboard"])
    service = ExportService(store, tmp_path / "exports", poll_s=0.1)
    service.start()
    try:
        service.watch(job_id)
        points = [MetricPoint(step=s, ts=float(s), values={"loss": 1.0 / s}) for s in (1, 2)]
        store.append_event(job_id, MetricsBatch(points=points), rank=0)
        _wait(lambda: any(s.state == "running" for s in _statuses(store, job_id)))
        store.append_event(
            job_id, MetricsBatch(points=[MetricPoint(step=3, ts=3.0, values={"loss": 0.3})]), rank=0
        )
        store.transition(job_id, JobState.SUCCEEDED, "every rank exited 0")
        _wait(lambda: any(s.state == "done" for s in _statuses(store, job_id)))
    finally:
        service.stop()
    running, done = _statuses(store, job_id)
    where = tmp_path / "exports" / job_id / "tensorboard"
    assert running == ExportStatus(to="tensorboard", state="running", location=str(where))
    assert done == ExportStatus(to="tensorboard", state="done", location=str(where))
    acc = EventAccumulator(str(where))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3]  # events before and after


def test_a_failing_tracker_gets_three_tries_then_the_job_shows_why(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    # an allowed "server" MLflow refuses: its file store is off unless opted into
    job_id = _job(store, export=["mlflow=file:///nowhere/mlruns"])
    service = ExportService(
        store, tmp_path / "exports", allowed_uris=("file:///nowhere/",), poll_s=0.1, retry_s=0
    )
    service.start()
    try:
        service.watch(job_id)
        failed = _wait(lambda: [s for s in _statuses(store, job_id) if s.state == "failed"])
    finally:
        service.stop()
    (status,) = failed
    assert "filesystem tracking backend" in status.error and "after 3 tries" in status.error
    log = tmp_path / "exports" / job_id / "mlflow" / "worker.log"
    assert str(log) in status.error and log.exists()


def test_a_worker_gets_only_its_trackers_credentials_from_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_TOKEN", "gateway-admin-token")  # the gateway's own secret
    store = SqliteStore(tmp_path / "air.db")
    env = {"MLFLOW_TRACKING_TOKEN": "ml-secret", "WANDB_API_KEY": "wb-secret", "LR": "0.1"}
    job_id = _job(store, export=["mlflow"], env=env)
    service = ExportService(store, tmp_path / "exports", poll_s=0.1)
    service.start()
    try:
        service.watch(job_id)
        _wait(lambda: any(s.state == "running" for s in _statuses(store, job_id)))
        (worker,) = service._workers.values()
        environ = Path(f"/proc/{worker.proc.pid}/environ").read_bytes().split(b"\0")
    finally:
        service.stop()
    names = {item.split(b"=", 1)[0].decode() for item in environ if item}
    assert "MLFLOW_TRACKING_TOKEN" in names
    assert not names & {"WANDB_API_KEY", "LR", "AIR_TOKEN"}


def test_only_allowed_tracking_servers_and_installed_trackers_are_accepted():
    spec = JobSpec(entrypoint="t.py", export=["mlflow=http://10.0.0.5:5000"])
    assert "allows no MLflow tracking server" in (ExportService.refusal_for(spec, ()) or "")
    assert ExportService.refusal_for(spec, ("http://10.0.0.5:5000",)) is None
    other = ExportService.refusal_for(spec, ("http://mlflow.internal",))
    assert other is not None and "it allows http://mlflow.internal" in other


@pytest.fixture
def silent_server():
    """An "MLflow server" on 127.0.0.1 that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:  # the timeout: look at `stop` again
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_tracker_that_hangs_delays_no_other_tracker_of_the_job(tmp_path, silent_server):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = SqliteStore(tmp_path / "air.db")
    job_id = _job(store, export=[f"mlflow={silent_server}", "tensorboard"])
    points = [MetricPoint(step=s, ts=float(s), values={"loss": 1.0 / s}) for s in range(1, 8)]
    store.append_event(job_id, MetricsBatch(points=points), rank=0)
    store.transition(job_id, JobState.SUCCEEDED, "every rank exited 0")
    service = ExportService(
        store, tmp_path / "exports", allowed_uris=("http://127.0.0.1:",), poll_s=0.1
    )
    service.start()
    try:
        service.watch(job_id)
        _wait(lambda: any(s.state == "done" for s in _statuses(store, job_id)))
        # the MLflow worker still waits for the server's answer to its first request
        assert [(s.to, s.state) for s in _statuses(store, job_id)] == [
            ("tensorboard", "running"),
            ("tensorboard", "done"),
        ]
        mlflow = tmp_path / "exports" / job_id / "mlflow"
        assert (mlflow / "worker.log").exists()  # started, and no answer confirmed yet
        assert not (mlflow / "state.json").exists()
    finally:
        service.stop()  # kills the waiting worker; not a failure of the export
    where = tmp_path / "exports" / job_id / "tensorboard"
    acc = EventAccumulator(str(where))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, 8))
    # stopping the gateway is no failure of the export: it starts over on a restart
    assert not (mlflow / "state.json").exists()
