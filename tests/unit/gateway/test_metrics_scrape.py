"""Who may read /metrics, and what a scrape of a gateway with a known history shows
(the store and the runner real, the runner's loop not started: the test moves jobs as
the runner would)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from gatewaytest import BASE_URL
from prometheus_client.parser import text_string_to_metric_families

from air_sdk.schema import FailureInfo, JobState, NodeAssignment, Placement, WorkerReport
from air_sdk.schema.events import CheckpointCommit, MetricPoint


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_only_the_system_admin_issues_a_metrics_token(tenancy):
    r = tenancy.client("admin").post("/v1/admin/tokens", json={"role": "metrics"})
    assert r.status_code == 403 and "issued by a system admin" in r.json()["detail"]
    sysadmin = tenancy.client("sysadmin")
    r = sysadmin.post("/v1/admin/tokens", json={"role": "metrics", "tenant": "acme"})
    assert r.status_code == 403  # a tenant's token must not read every tenant's numbers
    r = sysadmin.post("/v1/admin/tokens", json={"role": "metrics", "name": "prometheus"})
    assert r.status_code == 201 and r.json()["info"]["role"] == "metrics"
    fresh = tenancy.client(Authorization=f"Bearer {r.json()['token']}")
    assert fresh.get("/metrics").status_code == 200


def test_a_metrics_token_is_refused_elsewhere_with_what_to_use(tenancy):
    r = tenancy.client("metrics").get("/v1/jobs")
    assert r.status_code == 403
    assert r.json()["detail"] == "a metrics token reads /metrics only: use a member token"
    r = tenancy.client("owner").get("/metrics")
    assert r.status_code == 403 and "needs a metrics token" in r.json()["detail"]


@pytest.mark.parametrize("allowed", [True, False])
def test_loopback_without_a_token_only_when_the_gateway_allows_it(tenancy, allowed):
    tenancy.app.state.air.metrics_from_loopback = allowed
    local = TestClient(tenancy.app, base_url=BASE_URL, client=("127.0.0.1", 40000))
    assert local.get("/metrics").status_code == (200 if allowed else 401)
    remote = TestClient(tenancy.app, base_url=BASE_URL, client=("192.0.2.7", 40000))
    r = remote.get("/metrics")
    assert r.status_code == 401 and "air admin token create --role metrics" in r.json()["detail"]


def test_a_scrape_shows_the_history_it_was_given(tenancy):
    """One job ran, committed a checkpoint, crashed, restarted and succeeded; another
    was cancelled while queued: every instrument and gauge says so."""
    store = tenancy.store
    ran = tenancy.submit("owner", priority="low")
    attempt, token = tenancy.start(ran["id"])
    store.transition(ran["id"], JobState.RUNNING, "all ranks up")
    report = WorkerReport(
        rank=0,
        points=[MetricPoint(step=i, ts=0.0, values={"loss": 1.0}) for i in range(3)],
        checkpoints=[
            CheckpointCommit(
                step=2,
                path="/c/2",
                world_size=1,
                size_bytes=1,
                num_files=1,
                blocked_s=0.04,
                durable_s=0.5,
            )
        ],
    )
    r = tenancy.client().post(
        f"/v1/jobs/{ran['id']}/attempts/{attempt}/report",
        content=report.model_dump_json(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert r.status_code == 204, r.text
    crash = FailureInfo(attempt=1, reason="rank 0 exit code 3", kind="oom")
    store.end_attempt(ran["id"], attempt, "rank 0 exit code 3", crash)
    store.transition(ran["id"], JobState.RESTARTING, "oom", failure=crash)
    store.start_attempt(
        ran["id"], Placement(job_id=ran["id"], nodes=(NodeAssignment(node="node-0", slots=1),))
    )
    store.transition(ran["id"], JobState.STARTING, "relaunched")  # not a queue wait
    store.transition(ran["id"], JobState.RUNNING, "all ranks up")
    store.transition(ran["id"], JobState.SUCCEEDED, "done")
    cancelled = tenancy.submit("other")
    assert tenancy.client("other").post(f"/v1/jobs/{cancelled['id']}/cancel").status_code == 200

    m = scrape(tenancy.client("metrics"))
    wait = (
        "air_queue_wait_seconds_count",
        (("pool", "default"), ("priority", "low"), ("tenant", "acme")),
    )
    assert m[wait] == 1.0
    assert m[("air_job_restarts_total", (("reason", "oom"), ("tenant", "acme")))] == 1.0
    assert m[("air_jobs_finished_total", (("state", "SUCCEEDED"), ("tenant", "acme")))] == 1.0
    assert m[("air_jobs_finished_total", (("state", "CANCELLED"), ("tenant", "globex")))] == 1.0
    assert m[("air_job_goodput_ratio_count", (("tenant", "acme"),))] == 1.0
    assert ("air_job_goodput_ratio_count", (("tenant", "globex"),)) not in m  # never ran
    assert m[("air_jobs", (("state", "SUCCEEDED"), ("tenant", "acme")))] == 1.0
    assert m[("air_jobs", (("state", "QUEUED"), ("tenant", "acme")))] == 0.0
    assert m[("air_jobs", (("state", "CANCELLED"), ("tenant", "globex")))] == 1.0
    assert m[("air_ingest_points_total", ())] == 3.0
    assert m[("air_ingest_reports_total", (("format", "json"),))] == 1.0
    assert m[("air_ingest_report_seconds_count", ())] == 1.0
    assert m[("air_checkpoint_blocked_seconds_count", ())] == 1.0
    assert m[("air_checkpoint_blocked_seconds_sum", ())] == pytest.approx(0.04)
    assert m[("air_node_healthy", (("node", "node-0"),))] == 1.0
    assert m[("air_store_size_bytes", ())] > 0
