"""The data-loading line that `air status`, the monitor and `render_text` show once a
job's ranks count their data loading (`air.data.timed`)."""

from __future__ import annotations

from rich.console import Console

from air_sdk.cli.terminal_views import status_text
from air_sdk.notebook.snapshot_html import metrics_html, render_html, render_text
from air_sdk.schema import Event, JobRecord, JobSnapshot, JobSpec, JobState
from air_sdk.schema.data import DataLoading
from air_sdk.schema.events import MetricPoint, MetricsBatch

LINE = "20.0 samples/s · waits for data 50% of the time · cache hits 75% (3 of 4)"


def snapshot_with_data() -> JobSnapshot:
    snap = JobSnapshot(job_id="j", state=JobState.RUNNING)
    for seq, (ts, samples, waited) in enumerate(((10.0, 100, 1.0), (20.0, 300, 6.0)), 1):
        data = DataLoading(
            since=0.0,
            ts=ts,
            num_samples=samples,
            wait_s=waited,
            num_cache_hits=3,
            num_cache_misses=1,
        )
        points = [MetricPoint(step=seq, ts=ts, values={"loss": 1.0})]
        snap.apply(
            Event.of(MetricsBatch(points=points, data=data), seq=seq, job_id="j", ts=ts, rank=0)
        )
    return snap


def test_the_monitor_and_render_text_show_the_data_line():
    snap = snapshot_with_data()
    assert f"<b>data</b> {LINE}" in metrics_html(snap)
    assert f"<b>data</b> {LINE}" in render_html(snap)
    assert f"data {LINE}" in render_text(snap).splitlines()


def test_air_status_shows_the_data_line():
    record = JobRecord(
        id="j",
        name="n",
        tenant="t",
        spec=JobSpec(entrypoint="t.py"),
        state=JobState.RUNNING,
        created_at=0.0,
        updated_at=0.0,
    )
    console = Console(width=200, record=True)
    console.print(status_text(record, snapshot_with_data()))
    assert f"data: {LINE}" in console.export_text()


def test_no_line_for_jobs_that_do_not_count():
    snap = JobSnapshot(job_id="j")
    assert "data" not in metrics_html(snap) and "\ndata " not in render_text(snap)
