"""What the monitor's saved copy shows once a job ended: utilization as ended (not the
last live sample), and checkpoint paths short enough to read (issue 21 item 7)."""

from __future__ import annotations

import re

from air_sdk.notebook.snapshot_html import render_html, render_text
from air_sdk.schema import Event, JobSnapshot

SAMPLE = {"node": "node-0", "device": "cpu", "ts": 2.0, "util_pct": 97.0, "mem_used_mib": 2048}
CKPT = "/var/lib/air/tenants/acme/checkpoints/train-5d41402a/step-20"


def _snapshot(*, ended: bool) -> JobSnapshot:
    events = [
        Event(seq=1, job_id="j", ts=1.0, type="state", data={"state": "RUNNING"}),
        Event(seq=2, job_id="j", ts=2.0, type="util", rank=0, data={"samples": [SAMPLE]}),
        Event(
            seq=3, job_id="j", ts=3.0, type="checkpoint",
            data={"step": 20, "path": CKPT, "world_size": 1, "size_bytes": 2048,
                  "num_files": 2, "blocked_s": 0.1, "durable_s": 0.3, "attempt": 1},
        ),
    ]  # fmt: skip
    if ended:
        events.append(Event(seq=4, job_id="j", ts=4.0, type="state", data={"state": "SUCCEEDED"}))
    return JobSnapshot.fold("j", events)


def _visible(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_utilization_of_an_ended_job_says_it_ended() -> None:
    live = _visible(render_html(_snapshot(ended=False)))
    ended = _visible(render_html(_snapshot(ended=True)))

    assert "97%" in live
    assert "97%" not in ended and "utilization ended with the job" in ended
    assert "97%" not in render_text(_snapshot(ended=True))


def test_checkpoint_rows_show_a_short_path() -> None:
    page = _visible(render_html(_snapshot(ended=True)))

    assert "…/train-5d41402a/step-20" in page
    assert "/var/lib/air/tenants" not in page
