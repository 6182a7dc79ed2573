"""NaN and the infinities through the real gateway app, the event log, the snapshot and
the terminal views: standard JSON on the wire, floats again in every reader."""

from __future__ import annotations

import json
import math

import pytest
from gatewaytest import tenancy_for
from rich.console import Console

from air_sdk.cli.terminal_views import metrics_table, progress_metrics
from air_sdk.schema import Event, EventPage, JobSnapshot, JobState, MetricRow, MetricsPage
from air_sdk.schema.numbers import format_value, loads_data

REPORT = (
    '{"rank": 0, "points": [{"step": 1, "ts": 1.0, "values": {"loss": 2.0}},'
    ' {"step": 2, "ts": 2.0, "values": {"loss": NaN, "grad": Infinity, "low": -Infinity}}]}'
)


@pytest.fixture
def reported(tmp_path):
    """A job whose rank 0 posted a diverging loss (bare constants, as workers do)."""
    t = tenancy_for(tmp_path)
    job_id = t.submit("owner")["id"]
    attempt, token = t.start(job_id)
    r = t.client().post(
        f"/v1/jobs/{job_id}/attempts/{attempt}/report",
        content=REPORT,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert r.status_code == 204, r.text
    return t, job_id


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} is not standard JSON")

    return json.loads(text, parse_constant=refuse)


def test_events_page_carries_non_finite_values_as_strings_and_folds(reported):
    t, job_id = reported
    r = t.client("owner").get(f"/v1/jobs/{job_id}/events")
    assert r.status_code == 200
    body = _strict_json(r.text)
    (metrics,) = [e for e in body["events"] if e["type"] == "metrics"]
    assert metrics["data"]["points"][1]["values"] == {
        "loss": "NaN",
        "grad": "Infinity",
        "low": "-Infinity",
    }
    snap = JobSnapshot.fold(job_id, EventPage.model_validate_json(r.text).events)
    assert math.isnan(snap.latest["loss"])
    assert snap.latest["grad"] == math.inf and snap.latest["low"] == -math.inf
    assert [v for _, v in snap.series["grad"]] == [math.inf]


def test_metrics_page_is_standard_json_and_reads_back_as_floats(reported):
    t, job_id = reported
    r = t.client("owner").get(f"/v1/jobs/{job_id}/metrics")
    assert r.status_code == 200
    rows = _strict_json(r.text)["points"]
    assert rows[1]["values"]["loss"] == "NaN"
    page = MetricsPage.model_validate_json(r.text)
    assert math.isnan(page.points[1].values["loss"])
    assert page.points[1].values["low"] == -math.inf


def test_event_stream_is_standard_json(reported):
    t, job_id = reported
    t.store.transition(job_id, JobState.CANCELLED, "done")  # the stream ends with the job
    with t.client("owner").stream("GET", f"/v1/jobs/{job_id}/events/stream") as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    events = [Event.model_validate(_strict_json(d)) for d in data]
    (metrics,) = [e for e in events if e.type.value == "metrics"]
    assert math.isnan(JobSnapshot.fold(job_id, events).latest["loss"])
    assert metrics.data["points"][1]["values"]["grad"] == "Infinity"


def test_rows_stored_with_bare_constants_read_as_strings():
    assert loads_data('{"values": {"loss": NaN, "g": -Infinity}}') == {
        "values": {"loss": "NaN", "g": "-Infinity"}
    }


def test_snapshot_round_trips_through_json():
    snap = JobSnapshot(
        job_id="j",
        step=2,
        latest={"loss": math.nan, "grad": math.inf},
        series={"loss": [(1, 2.0), (2, math.nan)]},
    )
    text = snap.model_dump_json()
    _strict_json(text)
    back = JobSnapshot.model_validate_json(text)
    assert math.isnan(back.latest["loss"]) and back.latest["grad"] == math.inf
    assert math.isnan(back.series["loss"][1][1])


def test_terminal_views_say_nan_and_inf():
    snap = JobSnapshot(
        job_id="j", step=2, latest={"loss": math.nan, "tokens_per_s": math.inf, "mfu": math.nan}
    )
    line = progress_metrics(snap)
    assert "loss nan" in line and "inf tokens/s" in line and "MFU nan" in line
    assert [format_value(v) for v in (math.nan, math.inf, -math.inf, 0.5)] == [
        "nan",
        "inf",
        "-inf",
        "0.5",
    ]
    console = Console(width=120, record=True)
    console.print(
        metrics_table([MetricRow(attempt=1, rank=0, step=2, ts=0, values={"loss": -math.inf})])
    )
    assert "-inf" in console.export_text().split()
