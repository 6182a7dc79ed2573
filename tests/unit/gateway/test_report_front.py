"""The report route in front of the middleware stack (`ReportShortcut`): every guard of
the stack still answers it, with the stack's own state."""

from __future__ import annotations

import secrets
from pathlib import Path

import msgpack
import pytest
from fastapi.testclient import TestClient
from gatewaytest import BASE_URL, NO_RATE_LIMITS, make_app

from air_sdk.errors import ApiError
from air_sdk.gateway import routes
from air_sdk.gateway.options import RateLimit, RequestLimits, SecurityOptions
from air_sdk.gateway.report_shortcut import ReportShortcut
from air_sdk.schema import JobSpec, JobState, NodeAssignment, Placement
from air_sdk.schema.columns import to_columns
from air_sdk.store import SqliteStore

MSGPACK = {"Content-Type": "application/msgpack"}


def _gateway(
    home: Path, limits: RequestLimits = NO_RATE_LIMITS, **security: object
) -> tuple[TestClient, SqliteStore, str, str]:
    """(anonymous client, store, the report path of a running attempt, its worker token)"""
    app, store = make_app(home, SecurityOptions(limits=limits, **security))  # type: ignore[arg-type]
    job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
    store.transition(job.id, JobState.SCHEDULED, "placed")
    placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="node-0", slots=1),))
    attempt, token = store.start_attempt(job.id, placement)
    client = TestClient(app, base_url=BASE_URL, raise_server_exceptions=False)
    return client, store, f"/v1/jobs/{job.id}/attempts/{attempt}/report", token


def _body(step: int = 1) -> bytes:
    return msgpack.packb({"rank": 0, "columns": to_columns([(step, 1.0, {"loss": 0.5})])})


def _post(client: TestClient, path: str, token: str, body: bytes | None = None) -> int:
    headers = {**MSGPACK, "Authorization": f"Bearer {token}"}
    return client.post(path, content=_body() if body is None else body, headers=headers).status_code


def test_the_front_is_installed_with_the_stacks_own_guards(tmp_path: Path) -> None:
    client, _, path, token = _gateway(tmp_path)
    front = client.app.build_middleware_stack()  # type: ignore[attr-defined]
    assert isinstance(front, ReportShortcut)
    assert _post(client, path, token) == 204


def test_a_worker_over_its_rate_gets_429_from_the_front(tmp_path: Path) -> None:
    limits = RequestLimits(
        worker_rate=RateLimit(per_s=0.01, burst=2), user_rate=None, anonymous_rate=None
    )
    client, _, path, token = _gateway(tmp_path, limits)
    codes = [_post(client, path, token) for _ in range(3)]
    assert codes == [204, 204, 429]
    r = client.post(path, content=_body(), headers={**MSGPACK, "Authorization": f"Bearer {token}"})
    assert int(r.headers["Retry-After"]) >= 1 and "at most 0.01/s" in r.json()["detail"]


def test_failed_report_authentications_drain_the_address_for_every_route(tmp_path: Path) -> None:
    # the probe of issue 14, on the report route: a fresh random token per request
    limits = RequestLimits(anonymous_rate=RateLimit(per_s=0.01, burst=3))
    client, _, path, token = _gateway(tmp_path, limits)
    codes = [_post(client, path, f"airw_{secrets.token_urlsafe(32)}") for _ in range(5)]
    assert codes[:3] == [401, 401, 401] and codes[3:] == [429, 429]
    # the stack's routes see the same drained bucket (one state for both)
    assert client.get("/v1/health").status_code == 429
    # a real worker token still goes (it exists), and is then known to work
    assert _post(client, path, token) == 204


def test_the_front_refuses_a_foreign_host_and_a_body_over_the_cap(tmp_path: Path) -> None:
    client, store, path, token = _gateway(tmp_path)
    auth = {"Authorization": f"Bearer {token}"}
    r = client.post(path, content=_body(), headers={**MSGPACK, **auth, "Host": "evil.example"})
    assert r.status_code == 400 and "DNS rebinding" in r.json()["detail"]
    r = client.post(path, content=b"\x00" * (5 << 20), headers={**MSGPACK, **auth})
    assert r.status_code == 413 and "send smaller batches" in r.json()["detail"]

    # streamed without a Content-Length: cut off as the bytes pass the cap
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(5):
            yield b"\x00" * (1 << 20)

    r = client.post(path, content=chunks(), headers={**MSGPACK, **auth})
    assert r.status_code == 413
    r = client.post(path, content=_body(), headers={**MSGPACK, **auth, "Content-Length": "x1"})
    assert r.status_code == 400
    assert [e for e in store.read_events(path.split("/")[3]) if e.type.value == "metrics"] == []


def test_the_fronts_error_answers_carry_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaked = f"air_{secrets.token_urlsafe(32)}"

    async def failing(*args: object) -> None:
        raise ApiError(422, f"the body names {leaked}")

    monkeypatch.setattr(routes, "ingest_worker_report", failing)
    client, _, path, token = _gateway(tmp_path)
    r = client.post(path, content=_body(), headers={**MSGPACK, "Authorization": f"Bearer {token}"})
    assert r.status_code == 422
    assert leaked not in r.text and "***" in r.json()["detail"]


def test_an_unexpected_error_is_a_500(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(routes, "ingest_worker_report", broken)
    client, _, path, token = _gateway(tmp_path)
    r = client.post(path, content=_body(), headers={**MSGPACK, "Authorization": f"Bearer {token}"})
    assert r.status_code == 500 and "a bug" not in r.text


def test_with_cors_configured_reports_take_the_long_way_and_still_work(tmp_path: Path) -> None:
    client, store, path, token = _gateway(tmp_path, cors_origins=("https://lab.example",))
    assert not isinstance(client.app.build_middleware_stack(), ReportShortcut)  # type: ignore[attr-defined]
    assert _post(client, path, token) == 204
    assert _post(client, path, "airw_wrong") == 401
    job_id = path.split("/")[3]
    assert [e.type.value for e in store.read_events(job_id)].count("metrics") == 1
