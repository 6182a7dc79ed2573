"""`air status`, the live line and the summary show tokens/s and MFU when the job has them."""

import time

from rich.console import Console

from air_sdk.cli.terminal_views import progress_metrics, status_text, summary_table
from air_sdk.schema import JobRecord, JobSnapshot, JobSpec, JobState


def snapshot(**latest):
    return JobSnapshot(
        job_id="j",
        step=20,
        first_point_step=0,
        first_point_ts=0.0,
        last_point_ts=10.0,
        latest={"loss": 0.5, **latest},
    )


def text(renderable) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_progress_shows_tokens_per_s_and_mfu_not_as_raw_metrics():
    line = progress_metrics(snapshot(tokens=4096, tokens_per_s=1.234e6, mfu=0.412))
    # steps 0-20 are 21 steps
    assert line == "step 21  loss 0.5  tokens 4096  2.0 steps/s  1.23M tokens/s  MFU 41.2%"
    assert progress_metrics(snapshot()) == "step 21  loss 0.5  2.0 steps/s"


def test_status_and_summary_show_them():
    now = time.time()
    record = JobRecord(
        id="j",
        tenant="t",
        name="gpt2",
        state=JobState.RUNNING,
        spec=JobSpec(code="pass"),
        created_at=now,
        updated_at=now,
    )
    snap = snapshot(tokens_per_s=5.5e4, mfu=0.07)
    assert "55k tokens/s  MFU 7.0%" in text(status_text(record, snap))
    summary = text(summary_table(record, snap))
    assert "tokens/second  55k" in summary and "MFU            7.0%" in summary
