"""A failure says its rank and exit code once in what a notebook shows: `%air status`,
the monitor's text and HTML, and the `JobFailedError` a cell raises (issue 21 item 7:
"rank 0 exit code 1: rank 0 exit code 1")."""

from __future__ import annotations

import re
import time

from air_sdk.client.job import _failure_reason
from air_sdk.notebook.job_views import job_status_text
from air_sdk.notebook.snapshot_html import render_html, render_text
from air_sdk.schema import Event, FailureInfo, JobRecord, JobSnapshot, JobSpec, JobState

#: what the runner records for a rank that exited 1 with no other reason
FAILURE = FailureInfo(attempt=1, reason="rank 0 exit code 1", rank=0, exit_code=1)


def _snapshot() -> JobSnapshot:
    failure = FAILURE.model_dump(mode="json")
    events = [
        Event(seq=1, job_id="j", ts=1.0, type="state", data={"state": "RUNNING"}),
        Event(
            seq=2, job_id="j", ts=2.0, type="state", data={"state": "FAILED", "failure": failure}
        ),
    ]
    return JobSnapshot.fold("j", events)


def test_air_status_says_the_exit_once() -> None:
    now = time.time()
    record = JobRecord(
        id="j", tenant="t", name="cell", state=JobState.FAILED, spec=JobSpec(code="pass"),
        created_at=now, updated_at=now, attempt=1, failure=FAILURE,
    )  # fmt: skip

    text = job_status_text(record)

    assert text.count("exit code 1") == 1, text
    assert "failed (attempt 1): rank 0 exit code 1" in text


def test_the_monitor_says_the_exit_once() -> None:
    snapshot = _snapshot()

    text = render_text(snapshot)
    html_text = re.sub(r"<[^>]+>", "", render_html(snapshot))

    assert text.count("exit code 1") == 1, text
    assert html_text.count("exit code 1") == 1, html_text


def test_the_cells_error_says_the_exit_once() -> None:
    now = time.time()
    record = JobRecord(
        id="j", tenant="t", name="cell", state=JobState.FAILED, spec=JobSpec(code="pass"),
        created_at=now, updated_at=now, attempt=1, failure=FAILURE,
    )  # fmt: skip

    assert _failure_reason(record) == "rank 0 exit code 1"
