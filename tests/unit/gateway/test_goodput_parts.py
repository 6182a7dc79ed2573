"""GET /v1/jobs/{id} carries what goodput divides (training seconds kept, wall seconds),
so `air status` can say what it counts (issue 21 item 6)."""

from __future__ import annotations

from gatewaytest import Tenancy

from air_sdk.schema import JobState


def test_a_job_record_says_what_its_goodput_divides(tenancy: Tenancy) -> None:
    job = tenancy.submit("owner")
    tenancy.start(job["id"])
    tenancy.store.transition(job["id"], JobState.RUNNING, "every rank is up")

    record = tenancy.client("owner").get(f"/v1/jobs/{job['id']}").json()

    assert record["wall_s"] > 0
    assert 0 <= record["productive_s"] <= record["wall_s"]
    assert abs(record["goodput"] - record["productive_s"] / record["wall_s"]) < 1e-6


def test_a_job_not_started_has_no_goodput_parts(tenancy: Tenancy) -> None:
    job = tenancy.submit("owner")

    record = tenancy.client("owner").get(f"/v1/jobs/{job['id']}").json()

    assert record["goodput"] is None and record["productive_s"] is None
    assert record["wall_s"] is None
