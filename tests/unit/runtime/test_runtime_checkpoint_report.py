"""Checkpoint commits and skips travel worker -> shipper -> gateway route -> CHECKPOINT events,
and readers see them in JobSnapshot.checkpoints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_runtime_shipper import REPORT_PATH, FakeGateway

from air_sdk.runtime._poster import ReportPoster
from air_sdk.runtime._shipper import MetricsShipper
from air_sdk.schema.events import CheckpointCommit, CheckpointSkip, WorkerReport

COMMIT = {
    "step": 100,
    "path": "/ckpt/step-100",
    "world_size": 2,
    "size_bytes": 104857600,
    "num_files": 3,
    "blocked_s": 0.05,
    "durable_s": 1.25,
    "attempt": 1,
    "snapshot": "copy",
    "at_failure": False,
    "source": None,
}
SKIP = {
    "step": 120,
    "path": "/ckpt/step-120",
    "skipped": "file __1_0.distcp: missing",
    "attempt": 1,
}


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    gw = FakeGateway()
    yield gw
    gw.close()


def test_records_are_posted_once_even_when_the_first_post_fails(gateway: FakeGateway) -> None:
    gateway.answers.append((503, {}))  # the gateway is restarting: retried, not lost
    shipper = MetricsShipper(
        rank=0, poster=ReportPoster(gateway.report_url, "t"), flush_interval=0.05
    )
    shipper.add_checkpoint(COMMIT)
    shipper.add_checkpoint(SKIP)
    assert shipper.close(timeout=15)
    records = [
        record
        for body in gateway.reports
        for record in WorkerReport.model_validate(body).checkpoints
    ]
    assert records == [CheckpointCommit(**COMMIT), CheckpointSkip(**SKIP)]
    assert all(r["path"] == REPORT_PATH for r in gateway.requests)


def test_without_a_gateway_records_are_dropped_quietly() -> None:
    shipper = MetricsShipper(rank=0, poster=None)
    shipper.add_checkpoint(COMMIT)
    assert shipper.flush(timeout=0.1)


def test_a_report_with_records_validates_and_rejects_unknown_fields() -> None:
    report = WorkerReport.model_validate({"rank": 0, "checkpoints": [COMMIT, SKIP]})
    assert isinstance(report.checkpoints[0], CheckpointCommit)
    assert isinstance(report.checkpoints[1], CheckpointSkip)
    with pytest.raises(ValueError):
        WorkerReport.model_validate({"rank": 0, "checkpoints": [{**COMMIT, "surprise": 1}]})


@pytest.fixture
def gw(tmp_path: Path) -> Any:
    fastapi_testclient = pytest.importorskip("fastapi.testclient")
    from air_sdk.bundle import pack_directory
    from air_sdk.gateway.app import GatewayContext, create_app
    from air_sdk.runner import LocalBackend, Runner
    from air_sdk.scheduler import NodeSpec
    from air_sdk.schema import JobState, NodeAssignment, Placement
    from air_sdk.store import SqliteStore

    store = SqliteStore(tmp_path / "air.db")
    backend = LocalBackend(nodes=[NodeSpec("node-0", 1)])
    runner = Runner(store, backend, tmp_path, "http://127.0.0.1:1")
    app = create_app(GatewayContext(store=store, runner=runner, home=tmp_path), start_runner=False)
    client = fastapi_testclient.TestClient(app, base_url="http://127.0.0.1")
    client.headers["Authorization"] = f"Bearer {store.create_token()}"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    bundle = pack_directory(tmp_path / "src")
    assert client.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data).status_code == 201
    spec = {"entrypoint": "train.py", "bundle_sha256": bundle.sha256, "resources": {"nodes": 1}}
    job = client.post("/v1/jobs", json=spec).json()
    store.transition(job["id"], JobState.SCHEDULED, "placed")
    attempt, token = store.start_attempt(
        job["id"], Placement(job_id=job["id"], nodes=(NodeAssignment(node="node-0", slots=1),))
    )
    return client, job["id"], attempt, token


def test_the_gateway_turns_records_into_checkpoint_events_readers_fold(gw: Any) -> None:
    from air_sdk.schema import Event, JobSnapshot

    client, job_id, attempt, token = gw
    r = client.post(
        f"/v1/jobs/{job_id}/attempts/{attempt}/report",
        json={"rank": 0, "checkpoints": [COMMIT, SKIP]},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 204, r.text
    events = client.get(f"/v1/jobs/{job_id}/events", params={"after": 0}).json()["events"]
    checkpoint_events = [e for e in events if e["type"] == "checkpoint"]
    assert [e["data"] for e in checkpoint_events] == [COMMIT, SKIP]
    assert all(e["rank"] == 0 and e["attempt"] == attempt for e in checkpoint_events)
    snapshot = JobSnapshot.fold(job_id, [Event.model_validate(e) for e in events])
    assert [c.step for c in snapshot.checkpoints] == [100]
    assert [c.step for c in snapshot.skipped_checkpoints] == [120]
    assert snapshot.checkpoints[0].durable_s == 1.25
