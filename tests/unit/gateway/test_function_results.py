"""`result` reports of `@air_sdk.distributed` ranks: stored as events, read back by type,
secrets scrubbed from the error texts and refused in a return value."""

from __future__ import annotations

import base64
import pickle

from air_sdk.gateway_config import RequestLimits
from air_sdk.schema import FunctionResult
from air_sdk.schema.events import MAX_RESULT_BYTES


def post_result(tenancy, job_id: str, attempt: int, token: str, rank: int, result: FunctionResult):
    worker = tenancy.client(Authorization=f"Bearer {token}")
    body = {"rank": rank, "lines": ["a log line"], "result": result.model_dump(mode="json")}
    return worker.post(f"/v1/jobs/{job_id}/attempts/{attempt}/report", json=body)


def value(obj: object) -> FunctionResult:
    data = pickle.dumps(obj)
    return FunctionResult(ok=True, value_b64=base64.b64encode(data).decode(), size_bytes=len(data))


def test_a_result_becomes_an_event_that_readers_can_ask_for_alone(tenancy):
    job = tenancy.submit("owner")
    attempt, token = tenancy.start(job["id"])
    r = post_result(tenancy, job["id"], attempt, token, 0, value({"loss": 0.25}))
    assert r.status_code == 204, r.text

    owner = tenancy.client("owner")
    page = owner.get(f"/v1/jobs/{job['id']}/events", params={"type": "result"}).json()
    (event,) = page["events"]
    assert (event["type"], event["rank"], event["attempt"]) == ("result", 0, attempt)
    stored = FunctionResult.model_validate(event["data"])
    assert pickle.loads(base64.b64decode(stored.value_b64 or "")) == {"loss": 0.25}
    everything = owner.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    assert {e["type"] for e in everything} >= {"log", "result"}
    both = owner.get(f"/v1/jobs/{job['id']}/events", params={"type": ["log", "result"]}).json()
    assert [e["type"] for e in both["events"]] == ["log", "result"]


def test_a_raising_ranks_texts_are_scrubbed_of_the_jobs_secrets(tenancy):
    canary = "canary-5f2e81c0a9"
    job = tenancy.submit("owner", env={"WANDB_API_KEY": canary})
    attempt, token = tenancy.start(job["id"])
    error = FunctionResult(
        ok=False,
        error_type="ValueError",
        error=f"bad key {canary}",
        traceback=f"Traceback (most recent call last):\nValueError: bad key {canary}\n",
    )
    assert post_result(tenancy, job["id"], attempt, token, 1, error).status_code == 204
    page = tenancy.client("owner").get(f"/v1/jobs/{job['id']}/events", params={"type": "result"})
    assert canary not in page.text
    stored = FunctionResult.model_validate(page.json()["events"][0]["data"])
    assert stored.error == "bad key ***" and stored.traceback is not None
    assert stored.traceback.endswith("ValueError: bad key ***\n")


def test_a_return_value_holding_a_secret_or_a_token_is_refused(tenancy):
    canary = "canary-77d0c3b1e4"
    job = tenancy.submit("owner", env={"HF_TOKEN": canary})
    attempt, token = tenancy.start(job["id"])
    for leaked in ({"env": {"HF_TOKEN": canary}}, f"my token {token}"):
        r = post_result(tenancy, job["id"], attempt, token, 0, value(leaked))
        assert r.status_code == 422, r.text
        assert "the return value holds a secret" in r.json()["detail"]
    page = tenancy.client("owner").get(f"/v1/jobs/{job['id']}/events", params={"type": "result"})
    assert page.json()["events"] == []


def test_the_largest_return_value_fits_the_gateways_cap_on_worker_reports(tenancy):
    """A value of MAX_RESULT_BYTES pickled travels base64 (4/3 of it) in one report, which
    the gateway takes up to `RequestLimits.max_report_bytes`; one byte more is refused by
    the report's own model, not by the body cap."""
    base64_chars = (MAX_RESULT_BYTES + 2) // 3 * 4
    assert base64_chars < RequestLimits().max_report_bytes - (64 << 10)  # room for the rest
    job = tenancy.submit("owner")
    attempt, token = tenancy.start(job["id"])
    data = bytes(range(256)) * (MAX_RESULT_BYTES // 256)  # no run that reads as a token
    assert len(data) == MAX_RESULT_BYTES
    largest = FunctionResult(
        ok=True, value_b64=base64.b64encode(data).decode(), size_bytes=len(data)
    )
    r = post_result(tenancy, job["id"], attempt, token, 0, largest)
    assert r.status_code == 204, r.text[:300]
    page = tenancy.client("owner").get(f"/v1/jobs/{job['id']}/events", params={"type": "result"})
    (event,) = page.json()["events"]
    assert base64.b64decode(event["data"]["value_b64"]) == data

    worker = tenancy.client(Authorization=f"Bearer {token}")
    over = base64.b64encode(data + b"\0" * 3).decode()
    body = {"rank": 0, "result": {"ok": True, "value_b64": over, "size_bytes": len(data) + 3}}
    r = worker.post(f"/v1/jobs/{job['id']}/attempts/{attempt}/report", json=body)
    assert r.status_code == 422 and "result.value_b64" in r.text
