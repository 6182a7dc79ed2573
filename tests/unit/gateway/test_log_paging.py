"""Log answers are bounded pages, and the SDK and CLI still get every line (issue 14,
item 5: `GET .../logs` answered 95 MiB at once and the gateway grew by 518 MiB)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests
from fastapi.testclient import TestClient
from gatewaytest import BASE_URL
from typer.testing import CliRunner

from air_sdk.cli import main as cli
from air_sdk.client import Client
from air_sdk.client._http import mock_response, mock_session
from air_sdk.schema.events import LogBatch, MetricPoint, MetricsBatch
from air_sdk.store.pages import LOG_PAGE_BYTES

LINE_CHARS = 1000
LINES_PER_REPORT = 400
NUM_REPORTS = 24  # ~9.6 MB of text: at least three pages


@pytest.fixture
def noisy(tenancy):
    """An acme job with NUM_REPORTS reports of rank 0 and one short one of rank 1."""
    job = tenancy.submit("owner")
    attempt, _ = tenancy.start(job["id"])
    for r in range(NUM_REPORTS):
        lines = [f"r{r:02d} l{i:03d} " + "x" * LINE_CHARS for i in range(LINES_PER_REPORT)]
        tenancy.store.append_worker_events(job["id"], attempt, 0, [LogBatch(lines=lines)], None)
    tenancy.store.append_worker_events(job["id"], attempt, 1, [LogBatch(lines=["rank one"])], None)
    return tenancy, job["id"]


def _json(value) -> str:
    import json

    return json.dumps(value)


def _expected_rank0() -> list[str]:
    return [
        f"r{r:02d} l{i:03d} " + "x" * LINE_CHARS
        for r in range(NUM_REPORTS)
        for i in range(LINES_PER_REPORT)
    ]


@pytest.fixture
def sdk(noisy):
    tenancy, job_id = noisy
    inner = TestClient(tenancy.app, base_url=BASE_URL)
    sizes: list[int] = []

    def forward(request: requests.PreparedRequest) -> requests.Response:
        url = urlsplit(request.url or "")
        r = inner.request(
            request.method or "GET",
            url.path + (f"?{url.query}" if url.query else ""),
            content=request.body,
            headers=dict(request.headers),
        )
        sizes.append(len(r.content))
        return mock_response(r.status_code, content=r.content, headers=dict(r.headers))

    client = Client(
        "http://127.0.0.1:8470",
        token=tenancy.tokens["owner"],
        session=mock_session(forward),
        max_attempts=1,
    )
    return client.job(job_id), sizes


def test_a_page_is_bounded_and_says_there_is_more(noisy):
    tenancy, job_id = noisy
    owner = tenancy.client("owner")
    page = owner.get(f"/v1/jobs/{job_id}/logs").json()
    text = sum(len(line["text"]) for line in page["lines"])
    assert page["more"] is True
    assert text <= LOG_PAGE_BYTES + LINES_PER_REPORT * (LINE_CHARS + 10)  # + one report
    assert len(page["lines"]) % LINES_PER_REPORT == 0  # whole reports only
    few = owner.get(f"/v1/jobs/{job_id}/logs", params={"limit": 500}).json()
    assert len(few["lines"]) == LINES_PER_REPORT and few["more"]  # whole reports, >= 1


def test_the_sdk_gets_every_line_by_paging(sdk):
    job, sizes = sdk
    lines = job.logs(rank=0)
    assert [line.text for line in lines] == _expected_rank0()
    assert len(sizes) >= 3 and max(sizes) < 2 * LOG_PAGE_BYTES  # no one huge answer
    assert [line.text for line in job.logs()][-1] == "rank one"


def test_a_tail_longer_than_a_page_is_paged_back(sdk):
    job, sizes = sdk
    want = LINES_PER_REPORT * 15 + 7  # ~6 MB: more than one page
    lines = job.logs(rank=0, tail=want)
    assert [line.text for line in lines] == _expected_rank0()[-want:]
    assert len(sizes) >= 2
    assert [line.text for line in job.logs(rank=0, tail=3)] == _expected_rank0()[-3:]


def test_air_logs_prints_every_line(sdk, monkeypatch):
    job, _ = sdk
    monkeypatch.setattr(cli, "make_client", lambda *a, **k: job.client)
    r = CliRunner().invoke(cli.app, ["logs", job.id, "--rank", "0"], catch_exceptions=False)
    assert r.exit_code == 0
    printed = r.stdout.splitlines()
    assert printed == [f"[rank 0] {text}" for text in _expected_rank0()]


def test_metrics_are_paged_and_the_sdk_gets_every_point(noisy, sdk):

    tenancy, _ = noisy
    job, sizes = sdk
    for r in range(12):  # 12 reports x 5000 points: three default pages
        points = [MetricPoint(step=r * 5000 + s, ts=0.0, values={"loss": 1.0}) for s in range(5000)]
        tenancy.store.append_worker_events(job.id, 1, 0, [MetricsBatch(points=points)], None)
    sizes.clear()
    rows = job.metrics("loss")
    assert [row.step for row in rows] == list(range(60_000))
    assert len(sizes) == 3
