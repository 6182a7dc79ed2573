"""Worker reports as msgpack with columnar points: the runtime's shipper against the real
gateway over HTTP (uvicorn on 127.0.0.1), read back through the metrics API; malformed
binary batches refused with 422 and nothing stored; JSON still taken; and the shipper's
fall back to JSON where the gateway does not read what it posted."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import uvicorn
from fastapi.testclient import TestClient

from air_sdk.gateway.app import GatewayContext, create_app
from air_sdk.runner import LocalBackend, Runner
from air_sdk.runtime._poster import JSON_TYPE, PostOutcome, ReportPoster
from air_sdk.runtime._shipper import MetricsShipper
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import JobSpec, JobState, NodeAssignment, Placement
from air_sdk.schema.columns import to_columns
from air_sdk.schema.events import MAX_POINTS_PER_REPORT, MetricPoint, MetricsBatch
from air_sdk.store import SqliteStore

MSGPACK = {"Content-Type": "application/msgpack"}


@dataclass
class Gateway:
    client: TestClient  # the app in process, with a user token of the job's tenant
    store: SqliteStore
    job_id: str
    attempt: int
    worker_token: str

    @property
    def report_path(self) -> str:
        return f"/v1/jobs/{self.job_id}/attempts/{self.attempt}/report"

    def post(self, body: bytes, headers: dict[str, str]) -> Any:
        auth = {"Authorization": f"Bearer {self.worker_token}"}
        return self.client.post(self.report_path, content=body, headers={**auth, **headers})

    def metric_points(self) -> list[dict[str, Any]]:
        page = self.client.get(f"/v1/jobs/{self.job_id}/metrics", params={"limit": 200_000})
        assert page.status_code == 200, page.text
        points: list[dict[str, Any]] = page.json()["points"]
        return points

    def stored_metrics(self) -> list[dict[str, Any]]:
        events = self.store.read_events(self.job_id, limit=100_000)
        return [e.data for e in events if e.type.value == "metrics"]


@pytest.fixture
def gateway(tmp_path: Path) -> Gateway:
    store = SqliteStore(tmp_path / "air.db")
    backend = LocalBackend(nodes=[NodeSpec("node-0", 1)])
    runner = Runner(store, backend, tmp_path, "http://127.0.0.1:1")
    app = create_app(GatewayContext(store=store, runner=runner, home=tmp_path), start_runner=False)
    client = TestClient(app, base_url="http://127.0.0.1")
    client.headers["Authorization"] = f"Bearer {store.create_token()}"
    job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
    store.transition(job.id, JobState.SCHEDULED, "placed")
    placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="node-0", slots=1),))
    attempt, token = store.start_attempt(job.id, placement)
    return Gateway(client, store, job.id, attempt, token)


@pytest.fixture
def served(gateway: Gateway) -> Iterator[str]:
    """The same gateway app served over real HTTP; yields its report URL."""
    server = uvicorn.Server(
        uvicorn.Config(gateway.client.app, host="127.0.0.1", port=0, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}{gateway.report_path}"
    server.should_exit = True
    thread.join(10)


def _logged(shipper: MetricsShipper) -> list[tuple[int, dict[str, float]]]:
    """Log a mix a training loop produces: changing names, NaN, the infinities."""
    logged = []
    for step in range(2_500):
        values = {"loss": 1.0 / (step + 1), "lr": 3e-4}
        if step % 100 == 0:
            values["eval_acc"] = step / 2_500
        if step == 7:
            values["loss"] = math.nan
        if step == 8:
            values["grad_norm"] = -math.inf
        shipper.log(step, **values)
        logged.append((step, values))
    return logged


def _wire(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")


def test_shipper_msgpack_reports_read_back_through_the_metrics_api(
    gateway: Gateway, served: str
) -> None:
    poster = ReportPoster(served, gateway.worker_token)
    shipper = MetricsShipper(rank=0, poster=poster, flush_interval=0.05, batch_size=1000)
    logged = _logged(shipper)
    assert shipper.close(timeout=30)
    assert poster.takes_msgpack  # every report went as msgpack and was taken
    registry = gateway.client.app.state.air.metrics.registry
    sample = registry.get_sample_value
    assert sample("air_ingest_reports_total", {"format": "msgpack"}) >= 1
    assert sample("air_ingest_reports_total", {"format": "json"}) is None
    points = gateway.metric_points()
    assert [(p["step"], p["rank"]) for p in points] == [(s, 0) for s, _ in logged]
    assert [p["values"] for p in points] == [
        {k: _wire(v) for k, v in values.items()} for _, values in logged
    ]
    # the stored event is what a MetricsBatch of those points writes
    for data in gateway.stored_metrics():
        batch = MetricsBatch.model_validate(data)
        assert json.loads(batch.model_dump_json()) == data


def test_a_gateway_that_does_not_read_the_format_gets_json_from_then_on(
    gateway: Gateway, served: str, capfd: pytest.CaptureFixture[str]
) -> None:
    poster = ReportPoster(served, gateway.worker_token)
    point = (1, 100.0, {"loss": 0.5})
    body = msgpack.packb({"rank": 0, "columns": to_columns([point])})
    json_body = json.dumps(
        {"rank": 0, "points": [{"step": 1, "ts": 100.0, "values": {"loss": 0.5}}]}
    ).encode()
    # a binary format this gateway does not read: it answers 415
    outcome = poster.post(
        body, content_type="application/vnd.apache.arrow.stream", as_json=lambda: json_body
    )
    assert outcome is PostOutcome.DELIVERED
    assert not poster.takes_msgpack
    assert "does not read msgpack reports (HTTP 415); posting JSON" in capfd.readouterr().err
    shipper = MetricsShipper(rank=0, poster=poster, flush_interval=0.05)
    shipper.log(2, loss=0.25)
    assert shipper.close(timeout=30)
    assert [(p["step"], p["values"]) for p in gateway.metric_points()] == [
        (1, {"loss": 0.5}),
        (2, {"loss": 0.25}),
    ]


def test_a_gateway_reading_every_body_as_json_gets_the_json_after_its_422(
    gateway: Gateway, served: str
) -> None:
    # What a gateway from before msgpack does: it reads the msgpack body as JSON (422).
    poster = ReportPoster(served, gateway.worker_token)
    body = msgpack.packb({"rank": 0, "columns": to_columns([(1, 100.0, {"loss": 0.5})])})
    json_body = b'{"rank":0,"points":[{"step":1,"ts":100.0,"values":{"loss":0.5}}]}'
    assert poster.post(body, content_type=JSON_TYPE, as_json=lambda: json_body) is (
        PostOutcome.DELIVERED
    )
    assert not poster.takes_msgpack
    assert [p["step"] for p in gateway.metric_points()] == [1]


def test_json_and_msgpack_reports_of_the_same_points_read_back_equal(gateway: Gateway) -> None:
    points = [(1, 10.0, {"loss": 0.5}), (2, 11.0, {"loss": 0.25, "lr": 0.1})]
    as_json = {"rank": 0, "points": [{"step": s, "ts": t, "values": v} for s, t, v in points]}
    r = gateway.post(json.dumps(as_json).encode(), {"Content-Type": "application/json"})
    assert r.status_code == 204, r.text
    r = gateway.post(msgpack.packb({"rank": 0, "columns": to_columns(points)}), MSGPACK)
    assert r.status_code == 204, r.text
    json_data, msgpack_data = gateway.stored_metrics()
    assert json_data == msgpack_data
    read = [(p["step"], p["values"]) for p in gateway.metric_points()]
    assert read == [(1, {"loss": 0.5}), (2, {"loss": 0.25, "lr": 0.1})] * 2
    # curl's default type for -d is read as JSON too, as before
    r = gateway.post(
        json.dumps(as_json).encode(), {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 204, r.text


def _columns(**changes: Any) -> dict[str, Any]:
    columns = {
        "names": ["loss", "lr"],
        "step": [1, 2],
        "ts": [1.0, 2.0],
        "values": [[0.5, 0.4], [0.1, 0.1]],
    }
    return {**columns, **changes}


def _report(**columns: Any) -> bytes:
    return msgpack.packb({"rank": 0, "heartbeat_step": 2, "columns": _columns(**columns)})


MALFORMED: list[tuple[str, bytes, str]] = [
    ("truncated", _report()[:-5], "the body does not decode"),
    ("not a map", msgpack.packb([1, 2, 3]), "a map, not list"),
    ("extra data", _report() + b"\x01", "the body does not decode"),
    ("a number as a key", msgpack.packb({1: 2, "rank": 0}), "the body does not decode"),
    ("short ts", _report(ts=[1.0]), "columns.ts has 1 entries for 2 steps"),
    (
        "short values",
        _report(values=[[0.5], [0.1, 0.1]]),
        "columns.values[0] ('loss') has 1 entries",
    ),
    ("missing column", _report(values=[[0.5, 0.4]]), "2 names"),
    ("NaN time", _report(ts=[1.0, math.nan]), "columns.ts holds NaN"),
    ("string value", _report(values=[[0.5, "high"], [0.1, 0.1]]), "must hold numbers or None"),
    ("float step", _report(step=[1, 2.5]), "columns.step must all be integers"),
    ("bool value", _report(values=[[True, 0.4], [0.1, 0.1]]), "must hold numbers or None"),
    ("huge step", _report(step=[1, 1 << 64 - 1]), "outside 64-bit"),
    ("duplicate names", _report(names=["loss", "loss"]), "lists a name twice"),
    ("unknown key", msgpack.packb({"rank": 0, "columns": {**_columns(), "x": []}}), "exactly"),
    (
        "too many points",
        _report(
            step=list(range(MAX_POINTS_PER_REPORT + 1)),
            ts=[1.0] * (MAX_POINTS_PER_REPORT + 1),
            names=["loss"],
            values=[[0.5] * (MAX_POINTS_PER_REPORT + 1)],
        ),
        f"at most {MAX_POINTS_PER_REPORT}",
    ),
    (
        "points and columns",
        msgpack.packb(
            {"rank": 0, "points": [{"step": 1, "ts": 1.0, "values": {}}], "columns": _columns()}
        ),
        "not both",
    ),
    ("bad field", msgpack.packb({"rank": -1, "columns": _columns()}), "rank"),
]


def _twice(first: dict[str, Any], last: dict[str, Any]) -> bytes:
    """A report map with the key "columns" twice: decoders keep the last."""
    return b"".join(
        [b"\x83", msgpack.packb("rank"), msgpack.packb(0)]
        + [msgpack.packb("columns") + msgpack.packb(c) for c in (first, last)]
    )


def test_columns_given_twice_are_checked_and_stored_as_the_last(gateway: Gateway) -> None:
    # The store keeps the bytes the columns came in: they must be the ones checked.
    bad, good = _columns(values=[[0.5, "high"], [0.1, 0.1]]), _columns(step=[7, 8])
    r = gateway.post(_twice(good, bad), MSGPACK)
    assert r.status_code == 422 and "must hold numbers or None" in r.text
    assert gateway.metric_points() == []
    assert gateway.post(_twice(bad, good), MSGPACK).status_code == 204
    assert [p["step"] for p in gateway.metric_points()] == [7, 8]


@pytest.mark.parametrize(("case", "body", "says"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_binary_batches_are_refused_and_nothing_is_stored(
    gateway: Gateway, case: str, body: bytes, says: str
) -> None:
    seq = gateway.store.read_events(gateway.job_id)[-1].seq
    r = gateway.post(body, MSGPACK)
    assert r.status_code == 422, (case, r.text)
    assert says in r.json()["detail"], r.json()["detail"]
    assert gateway.store.read_events(gateway.job_id)[-1].seq == seq  # nothing appended
    assert gateway.metric_points() == []


def test_a_content_type_the_gateway_does_not_read_is_415_and_says_what_it_reads(
    gateway: Gateway,
) -> None:
    r = gateway.post(_report(), {"Content-Type": "application/x-protobuf"})
    assert r.status_code == 415
    assert "application/json" in r.json()["detail"] and "application/msgpack" in r.json()["detail"]
    assert gateway.metric_points() == []


def test_a_bad_worker_token_is_401_whatever_the_body(gateway: Gateway) -> None:
    r = gateway.client.post(
        gateway.report_path, content=b"\xc1", headers={**MSGPACK, "Authorization": "Bearer no"}
    )
    assert r.status_code == 401


def test_a_value_a_point_lacks_stays_absent(gateway: Gateway) -> None:
    body = _report(values=[[0.5, None], [None, 0.1]])
    assert gateway.post(body, MSGPACK).status_code == 204
    assert [p["values"] for p in gateway.metric_points()] == [{"loss": 0.5}, {"lr": 0.1}]
    [data] = gateway.stored_metrics()
    assert MetricsBatch.model_validate(data).points[1] == MetricPoint(
        step=2, ts=2.0, values={"lr": 0.1}
    )


def test_reports_skip_fastapi_routing_but_not_the_guards(gateway: Gateway) -> None:
    # the body cap (4 MiB for reports), from Content-Length or as the bytes stream in
    r = gateway.post(b"\x00" * (5 << 20), MSGPACK)
    assert r.status_code == 413 and "send smaller batches" in r.json()["detail"]
    # the Host allow-list (DNS rebinding)
    r = gateway.client.post(
        gateway.report_path,
        content=_report(),
        headers={
            **MSGPACK,
            "Authorization": f"Bearer {gateway.worker_token}",
            "Host": "evil.example",
        },
    )
    assert r.status_code == 400
    # an attempt that is not a number still gets FastAPI's own answer
    r = gateway.client.post(f"/v1/jobs/{gateway.job_id}/attempts/one/report", content=b"{}")
    assert r.status_code == 422 and "attempt" in r.text
    assert gateway.metric_points() == []
