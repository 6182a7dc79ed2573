"""The `/ui` page's routes: the page holds no data and carries a strict CSP; a job's
rendered monitor follows the job routes' tenancy, escapes what the job wrote, and says
whether this caller may cancel."""

from __future__ import annotations

import pytest
from gatewaytest import tenancy_for

from air_sdk.schema import ExportStatus, LogBatch, MetricPoint, MetricsBatch


@pytest.fixture
def tenancy(tmp_path):
    return tenancy_for(tmp_path)


def test_the_page_and_its_files_need_no_token_hold_no_data_and_allow_only_themselves(tenancy):
    anonymous = tenancy.client()
    for path, kind in (
        ("/ui", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ):
        answer = anonymous.get(path)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith(kind)
        csp = answer.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
    page = anonymous.get("/ui").text
    assert '<script src="/ui/app.js"' in page and "http" not in page  # nothing from elsewhere
    script = anonymous.get("/ui/app.js").text
    assert "sessionStorage" in script and "localStorage" not in script


def test_a_jobs_monitor_is_its_tenants_only_and_escapes_what_the_job_wrote(tenancy):
    job = tenancy.submit("owner")
    tenancy.start(job["id"])
    evil = "<script>alert(1)</script>"
    tenancy.store.append_event(
        job["id"], MetricsBatch(points=[MetricPoint(step=1, ts=1.0, values={evil: 1.0})]), rank=0
    )
    tenancy.store.append_event(job["id"], LogBatch(lines=[evil]), rank=0)
    answer = tenancy.client("owner").get(f"/v1/ui/jobs/{job['id']}")
    assert answer.status_code == 200, answer.text
    page = answer.json()
    assert page["state"] == "STARTING" and page["can_cancel"] is True and not page["terminal"]
    assert evil not in page["html"] and "&lt;script&gt;alert(1)&lt;/script&gt;" in page["html"]
    assert tenancy.client("viewer").get(f"/v1/ui/jobs/{job['id']}").json()["can_cancel"] is False
    assert tenancy.client("other").get(f"/v1/ui/jobs/{job['id']}").status_code == 404
    assert tenancy.client().get(f"/v1/ui/jobs/{job['id']}").status_code == 401


def test_the_monitor_is_folded_incrementally_and_sees_new_events(tenancy):
    job = tenancy.submit("owner")
    tenancy.start(job["id"])
    owner = tenancy.client("owner")
    point = MetricsBatch(points=[MetricPoint(step=3, ts=1.0, values={"loss": 0.5})])
    first = owner.get(f"/v1/ui/jobs/{job['id']}").json()
    tenancy.store.append_event(job["id"], point, rank=0)
    second = owner.get(f"/v1/ui/jobs/{job['id']}").json()
    assert second["last_seq"] == first["last_seq"] + 1
    assert "step 3" in second["html"] and "step 3" not in first["html"]


def test_the_job_page_shows_each_export_as_the_monitor_does(tenancy):
    job = tenancy.submit("owner")
    tenancy.start(job["id"])
    for status in (
        ExportStatus(to="tensorboard", state="running", location="/h/exports/j/tensorboard"),
        ExportStatus(to="mlflow", state="failed", error="no answer in 180 s"),
    ):
        tenancy.store.append_event(job["id"], status)
    page = tenancy.client("owner").get(f"/v1/ui/jobs/{job['id']}").json()
    assert "export to tensorboard: running, /h/exports/j/tensorboard" in page["html"]
    assert "export to mlflow: failed: no answer in 180 s" in page["html"]
