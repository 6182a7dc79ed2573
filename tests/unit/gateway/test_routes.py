"""Gateway routes over a real store, with the runner not started (no processes)."""

import hashlib
import io
import json
import tarfile

import pytest
from fastapi.testclient import TestClient

from air_sdk.bundle import pack_directory
from air_sdk.gateway.app import GatewayContext, create_app
from air_sdk.runner import LocalBackend, Runner
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import JobState, NodeAssignment, Placement
from air_sdk.store import SqliteStore


@pytest.fixture
def gw(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    backend = LocalBackend(nodes=[NodeSpec("node-0", 1), NodeSpec("node-1", 1)])
    runner = Runner(store, backend, tmp_path, "http://127.0.0.1:1")
    app = create_app(GatewayContext(store=store, runner=runner, home=tmp_path), start_runner=False)
    token = store.create_token()
    client = TestClient(app, base_url="http://127.0.0.1")
    client.headers["Authorization"] = f"Bearer {token}"
    client.store = store
    return client


def upload(gw, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    b = pack_directory(tmp_path / "src")
    r = gw.put(f"/v1/bundles/{b.sha256}", content=b.data)
    assert r.status_code == 201, r.text
    return b.sha256


def spec(sha, **kw):
    return {"entrypoint": "train.py", "bundle_sha256": sha, "resources": {"nodes": 2}, **kw}


def test_health_needs_no_token_everything_else_does(gw):
    anon = TestClient(gw.app, base_url="http://127.0.0.1")
    assert anon.get("/v1/health").json()["status"] == "ok"
    for method, path in [
        ("GET", "/v1/jobs"),
        ("GET", "/v1/cluster"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/x/events"),
        ("GET", "/v1/openapi.json"),
    ]:
        r = anon.request(method, path)
        assert r.status_code == 401, (method, path)
        assert "token" in r.json()["detail"]
    bad = anon.get("/v1/jobs", headers={"Authorization": "Bearer air_wrong"})
    assert bad.status_code == 401


def test_submit_is_idempotent_by_key(gw, tmp_path):
    sha = upload(gw, tmp_path)
    a = gw.post("/v1/jobs", json=spec(sha), headers={"Idempotency-Key": "k"})
    b = gw.post("/v1/jobs", json=spec(sha), headers={"Idempotency-Key": "k"})
    assert a.status_code == 201 and b.status_code == 200
    assert a.json()["id"] == b.json()["id"]
    assert a.json()["state"] == "QUEUED" and a.json()["queue_position"] == 1
    c = gw.post("/v1/jobs", json=spec(sha, max_restarts=3), headers={"Idempotency-Key": "k"})
    assert c.status_code == 422 and "Idempotency-Key" in c.json()["detail"]
    assert len(gw.get("/v1/jobs").json()["jobs"]) == 1


def test_bad_specs_say_what_to_change(gw, tmp_path):
    r = gw.post("/v1/jobs", json={"entrypoint": "t.py", "resources": {"nodes": 0}})
    assert r.status_code == 422 and "resources.nodes" in r.json()["detail"]
    r = gw.post("/v1/jobs", json={"entrypoint": "t.py"})
    assert r.status_code == 400 and "upload a bundle" in r.json()["detail"]
    r = gw.post("/v1/jobs", json={"entrypoint": "t.py", "bundle_sha256": "a" * 64})
    assert r.status_code == 400 and "was not uploaded" in r.json()["detail"]
    sha = upload(gw, tmp_path)
    r = gw.post("/v1/jobs", json=spec(sha, resources={"nodes": 3}))
    assert r.status_code == 400 and "lower --nodes" in r.json()["detail"]


def test_bundle_upload_checks_hash_and_safety(gw):
    data = b"not a tarball"
    assert gw.put("/v1/bundles/" + "0" * 64, content=data).status_code == 400
    assert gw.put("/v1/bundles/NOT-HEX", content=data).status_code == 400
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("../evil.py")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    evil = buf.getvalue()
    sha = hashlib.sha256(evil).hexdigest()
    r = gw.put(f"/v1/bundles/{sha}", content=evil)
    assert r.status_code == 400 and "refused" in r.json()["detail"]
    assert gw.head(f"/v1/bundles/{sha}").status_code == 404


def test_unknown_job_is_404(gw):
    for path in [
        "/v1/jobs/nope",
        "/v1/jobs/nope/events",
        "/v1/jobs/nope/logs",
        "/v1/jobs/nope/metrics",
    ]:
        assert gw.get(path).status_code == 404
    assert gw.post("/v1/jobs/nope/cancel").status_code == 404


def _running_job(gw, tmp_path):
    sha = upload(gw, tmp_path)
    job = gw.post("/v1/jobs", json=spec(sha)).json()
    store = gw.store
    store.transition(job["id"], JobState.SCHEDULED, "placed")
    attempt, token = store.start_attempt(
        job["id"], Placement(job_id=job["id"], nodes=(NodeAssignment(node="node-0", slots=1),))
    )
    return job["id"], attempt, token


def test_worker_reports_become_metrics_logs_and_events(gw, tmp_path):
    job_id, attempt, token = _running_job(gw, tmp_path)
    url = f"/v1/jobs/{job_id}/attempts/{attempt}/report"
    body = {
        "rank": 1,
        "points": [
            {"step": 1, "ts": 1.0, "values": {"loss": 0.5}},
            {"step": 2, "ts": 2.0, "values": {"loss": 0.25, "lr": 0.1}},
        ],
        "lines": ["epoch 0", "epoch 1"],
    }
    assert gw.post(url, json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    r = gw.post(url, json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 204, r.text
    metrics = gw.get(f"/v1/jobs/{job_id}/metrics", params={"name": "loss"}).json()["points"]
    assert [(p["step"], p["rank"], p["values"]) for p in metrics] == [
        (1, 1, {"loss": 0.5}),
        (2, 1, {"loss": 0.25}),
    ]
    logs = gw.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1, "tail": 1}).json()["lines"]
    assert [line["text"] for line in logs] == ["epoch 1"]
    page = gw.get(f"/v1/jobs/{job_id}/events", params={"after": 0}).json()
    assert [e["seq"] for e in page["events"]] == list(range(1, page["last_seq"] + 1))
    # a newer attempt fences the old token off
    gw.store.start_attempt(
        job_id, Placement(job_id=job_id, nodes=(NodeAssignment(node="node-0", slots=1),))
    )
    r = gw.post(url, json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 409 and "no longer current" in r.json()["detail"]


def test_sse_stream_replays_from_last_event_id_and_ends_with_the_job(gw, tmp_path):
    sha = upload(gw, tmp_path)
    job = gw.post("/v1/jobs", json=spec(sha)).json()
    gw.post(f"/v1/jobs/{job['id']}/cancel")
    with gw.stream(
        "GET", f"/v1/jobs/{job['id']}/events/stream", headers={"Last-Event-ID": "1"}
    ) as r:
        body = "".join(r.iter_text())
    data = [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
    assert [d["seq"] for d in data] == [2]
    assert data[0]["data"]["state"] == "CANCELLED"
    assert "id: 2" in body


def test_cancel_of_queued_job_is_immediate_and_idempotent(gw, tmp_path):
    sha = upload(gw, tmp_path)
    job = gw.post("/v1/jobs", json=spec(sha)).json()
    assert gw.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "CANCELLED"
    assert gw.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "CANCELLED"


def test_cluster_and_openapi(gw):
    nodes = gw.get("/v1/cluster").json()["nodes"]
    assert [(n["name"], n["slots"], n["used_slots"]) for n in nodes] == [
        ("node-0", 1, 0),
        ("node-1", 1, 0),
    ]
    paths = gw.get("/v1/openapi.json").json()["paths"]
    assert "/v1/jobs/{job_id}/events/stream" in paths and "/v1/jobs" in paths


def test_a_diverging_loss_reaches_readers_as_nan(gw, tmp_path):
    job_id, attempt, token = _running_job(gw, tmp_path)
    body = '{"rank": 0, "points": [{"step": 1, "ts": 1.0, "values": {"loss": NaN}}]}'
    r = gw.post(
        f"/v1/jobs/{job_id}/attempts/{attempt}/report",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert r.status_code == 204
    points = gw.get(f"/v1/jobs/{job_id}/metrics").json()["points"]
    assert points[0]["values"]["loss"] == "NaN"  # standard JSON (air_sdk.schema.numbers)
    events = gw.get(f"/v1/jobs/{job_id}/events").json()["events"]
    assert any(e["type"] == "metrics" for e in events)
