"""The pure renderers: a snapshot folded from events -> HTML fragment, text and PNG.

No network, no widgets: what a notebook export or a terminal shows of a job.
"""

from __future__ import annotations

import base64
import re

import pytest

from air_sdk.notebook import snapshot_html
from air_sdk.notebook.chart import PNG_MAGIC, render_chart_png
from air_sdk.notebook.snapshot_html import render_html, render_text
from air_sdk.schema import Event, JobSnapshot, JobState
from air_sdk.text import clock

JOB = "j-render"


class Log:
    """Builds a job's event log with gapless sequence numbers."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, type_: str, rank: int | None = None, ts: float | None = None, **data: object):
        seq = len(self.events) + 1
        self.events.append(
            Event(
                seq=seq,
                job_id=JOB,
                ts=float(seq) if ts is None else ts,
                type=type_,
                rank=rank,
                data=data,
            )
        )
        return self

    def state(self, state: JobState, **extra: object) -> Log:
        return self.add("state", state=state.value, **extra)

    def step(self, step: int, ts: float | None = None, **values: float) -> Log:
        ts = float(step) if ts is None else ts
        return self.add("metrics", rank=0, points=[{"step": step, "ts": ts, "values": values}])

    def checkpoint(self, step: int, size_bytes: int = 1024, durable_s: float = 1.0) -> Log:
        return self.add(
            "checkpoint",
            step=step,
            path=f"/ck/{step}",
            world_size=2,
            size_bytes=size_bytes,
            num_files=3,
            blocked_s=0.05,
            durable_s=durable_s,
            attempt=1,
        )

    def snapshot(self) -> JobSnapshot:
        return JobSnapshot.fold(JOB, self.events)


def running(num_steps: int = 10, **values: float) -> Log:
    log = Log().state(JobState.RUNNING).add("attempt", attempt=1, phase="started")
    for step in range(1, num_steps + 1):
        log.step(step, loss=1.0 / step, **values)
    return log


def visible_text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def body_rows(html: str) -> list[str]:
    """The first table's body rows after `html` starts, cells joined by "|"."""
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [visible_text(row.replace("</td>", "|")) for row in re.findall(r"<tr>(.*?)</tr>", body)]


# -- HTML -------------------------------------------------------------------------


def test_html_shows_state_attempt_step_and_name() -> None:
    page = render_html(running(10).snapshot(), name="demo-run")
    text = visible_text(page)
    assert "RUNNING" in text
    assert "attempt 1" in text
    assert "step 10" in text
    assert "demo-run" in text
    assert JOB in text


def test_html_escapes_log_lines_names_and_reasons() -> None:
    log = running(2).add("log", rank=0, lines=["ok", "<script>alert('x')</script>"])
    log.state(JobState.FAILED, reason="<b>bad</b>")
    page = render_html(log.snapshot(), name="<img src=x onerror=alert(1)>")
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<img src=x" not in page
    assert "<b>bad</b>" not in page and "&lt;b&gt;bad&lt;/b&gt;" in page


def test_html_shows_failure_rank_exit_code_and_tail() -> None:
    failure = {
        "attempt": 1,
        "reason": "rank 1 exited with an error",
        "rank": 1,
        "exit_code": 3,
        "log_tail": ["Traceback (most recent call last):", "ValueError: <nan>"],
        "rank_exits": [
            {"rank": 1, "exit_code": 3},
            {"rank": 0, "signal": "SIGTERM"},
        ],
    }
    log = running(5).state(JobState.FAILED, reason="max restarts reached", failure=failure)
    text = visible_text(render_html(log.snapshot()))
    assert "FAILED" in text
    assert "rank 1" in text and "exit code 3" in text
    assert "ValueError: &lt;nan&gt;" in text  # the tail, escaped
    assert "rank 0 killed by SIGTERM" in text  # the peers that died after it, not blamed


def test_html_failure_by_signal_and_recovered_attempt() -> None:
    failure = {"attempt": 1, "reason": "lost", "rank": 0, "signal": "SIGKILL"}
    log = running(3).state(JobState.RESTARTING, failure=failure)
    assert "restarting" in render_html(log.snapshot())
    log.state(JobState.STARTING).add("attempt", attempt=2, phase="started").state(JobState.RUNNING)
    text = visible_text(render_html(log.snapshot()))
    assert "killed by signal SIGKILL" in text
    assert "recovered: attempt 2" in text
    assert "attempt 2 (1 restart)" in text


def test_html_carries_a_few_rank_logs_failing_rank_first() -> None:
    log = running(2)
    for rank in range(12):
        log.add("log", rank=rank, lines=[f"line of rank {rank}"])
    failure = {"attempt": 1, "reason": "crash", "rank": 9, "exit_code": 1}
    page = render_html(log.state(JobState.FAILED, failure=failure).snapshot(), max_log_ranks=3)
    shown = re.findall(r"rank (\d+) log", page)
    assert shown == ["9", "0", "1"]
    assert "and the logs of 9 more ranks" in page


def test_html_utilization_rows_per_node_and_device() -> None:
    samples = [
        {"node": "node-b", "device": "cpu", "ts": 1.0, "util_pct": 12.0, "mem_used_mib": 2048},
        {
            "node": "node-a",
            "device": "gpu0",
            "ts": 1.0,
            "util_pct": 87.4,
            "mem_used_mib": 40960,
            "mem_total_mib": 81920,
            "power_w": 301.0,
        },
    ]
    page = render_html(running(2).add("util", rank=0, samples=samples).snapshot())
    assert body_rows(page.split("utilization", 1)[1]) == [
        "node-a|gpu0|87%|40.0 / 80.0 GiB|301 W|",
        "node-b|cpu|12%|2048 MiB||",
    ]


def test_html_checkpoint_rows_newest_first_with_their_fields() -> None:
    log = running(30)
    log.checkpoint(10, size_bytes=3 * 1024**2, durable_s=0.25)
    log.checkpoint(20, size_bytes=3 * 1024**3, durable_s=1.5)
    page = render_html(log.snapshot())
    saved = [clock(e.ts) for e in log.events[-2:]]  # when each commit event was recorded
    assert body_rows(page.split("checkpoints (2)", 1)[1]) == [
        f"20|{saved[1]}|1|3.0 GiB|0.05 s|1.50 s|/ck/20|",
        f"10|{saved[0]}|1|3.0 MiB|0.05 s|0.25 s|/ck/10|",
    ]


def test_html_embeds_the_chart_as_an_inline_png() -> None:
    snapshot = running(5).snapshot()
    png = render_chart_png(snapshot, "loss")
    assert png is not None
    page = render_html(snapshot, chart_png=png)
    match = re.search(r'src="data:image/png;base64,([^"]+)"', page)
    assert match is not None
    assert base64.b64decode(match.group(1)) == png


def test_html_progress_and_eta_need_a_total() -> None:
    # 10 steps in 9 s: 1 step/s from the first point to the last.
    snapshot = running(10).snapshot()
    assert "ETA" not in render_html(snapshot)
    page = render_html(snapshot, total_steps=100)
    assert "step 10 / 100 (10%)" in page
    assert "ETA 1m 30s" in page
    assert '<progress value="10" max="100"' in page
    # ... or from a logged `total_steps` scalar.
    assert "ETA 1m 30s" in render_html(running(10, total_steps=100).snapshot())


def test_html_without_any_events_is_still_a_page() -> None:
    page = render_html(JobSnapshot(job_id=JOB))
    assert "QUEUED" in page and "no steps yet" in page


# -- helpers ----------------------------------------------------------------------


def test_throughput_from_per_step_samples_or_the_runtimes_tokens_per_s() -> None:
    per_step = running(10, samples=32, tokens=4096).snapshot()  # 1 step/s
    # tokens= is per rank: only the runtime (which knows the data-parallel size) scales it
    assert snapshot_html.throughput(per_step) == [("samples/s", 32.0)]
    direct = running(10, tokens_per_s=5e4, tokens=4096).snapshot()
    assert snapshot_html.throughput(direct) == [("tokens/s", 5e4)]
    assert snapshot_html.throughput(JobSnapshot(job_id=JOB)) == []


def test_mfu_is_what_the_runtime_measured() -> None:
    snapshot = Log().step(0, ts=0.0, loss=1.0).step(20, ts=10.0, loss=0.5, mfu=0.2).snapshot()
    assert snapshot_html.mfu(snapshot) == pytest.approx(0.2)
    assert snapshot_html.mfu(Log().step(0, ts=0.0, loss=1.0).snapshot()) is None
    page = render_html(snapshot)
    assert "MFU 20.0%" in page
    text = render_text(snapshot)
    assert "MFU 20.0%" in text and "mfu 0.2" not in text


@pytest.mark.parametrize(
    ("rate", "text"),
    [(45.06, "45.1 steps/s"), (0.25, "4.0 s/step"), (None, ""), (0.0, "")],
)
def test_format_rate(rate: float | None, text: str) -> None:
    assert snapshot_html.format_rate(rate) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (42, "42s"), (185, "3m 05s"), (3725, "1h 02m"), (2 * 86400 + 7200, "2d 02h")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert snapshot_html.format_duration(seconds) == text


def test_eta_only_while_running_with_a_rate_and_total() -> None:
    log = running(10)
    assert snapshot_html.eta_seconds(log.snapshot(), 100) == pytest.approx(90.0)
    assert snapshot_html.eta_seconds(log.snapshot(), None) is None
    assert snapshot_html.eta_seconds(log.state(JobState.SUCCEEDED).snapshot(), 100) is None


def test_metric_names_put_loss_first() -> None:
    snapshot = running(3, lr=0.1, acc=0.5).snapshot()
    assert snapshot_html.metric_names(snapshot) == ["loss", "acc", "lr"]
    assert snapshot_html.default_metric(snapshot) == "loss"


# -- text -------------------------------------------------------------------------


def test_text_summary_for_terminals() -> None:
    failure = {"attempt": 1, "reason": "worker crashed", "rank": 1, "exit_code": 3}
    log = running(10, samples=8).add("log", rank=1, lines=["last words"])
    log.checkpoint(5)
    log.state(JobState.FAILED, failure=failure)
    text = render_text(log.snapshot(), name="demo", total_steps=100)
    assert text.splitlines()[0] == f"{JOB} (demo)  FAILED  attempt 1"
    assert "step 10 / 100 (10%)" in text
    assert "loss 0.1" in text
    assert "8 samples/s" in text
    assert "checkpoints: 1 (latest at step 5)" in text
    assert "rank 1 exit code 3: worker crashed" in text
    assert "  | last words" in text


# -- chart ------------------------------------------------------------------------


def test_chart_is_a_png_that_follows_the_data() -> None:
    log = running(20)
    first = render_chart_png(log.snapshot(), "loss")
    assert first is not None and first.startswith(PNG_MAGIC)
    assert render_chart_png(log.snapshot(), "loss") == first  # same data, same bytes
    log.step(21, loss=5.0)
    second = render_chart_png(log.snapshot(), "loss")
    assert second is not None and second.startswith(PNG_MAGIC) and second != first


def test_chart_draws_restart_and_checkpoint_markers() -> None:
    log = running(20)
    plain = render_chart_png(log.snapshot(), "loss")
    log.checkpoint(10)
    with_checkpoint = render_chart_png(log.snapshot(), "loss")
    log.state(JobState.RESTARTING)
    with_restart = render_chart_png(log.snapshot(), "loss")
    assert len({plain, with_checkpoint, with_restart}) == 3


def test_chart_size_and_missing_metric() -> None:
    snapshot = running(3).snapshot()
    assert render_chart_png(snapshot, "no-such-metric") is None
    assert render_chart_png(JobSnapshot(job_id=JOB), "loss") is None
    png = render_chart_png(snapshot, "loss", width_px=320, height_px=120)
    assert png is not None
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (320, 120)


def test_chart_survives_nan_and_infinity() -> None:
    log = Log().step(1, loss=1.0).step(2, loss=float("nan")).step(3, loss=float("inf"))
    png = render_chart_png(log.step(4, loss=0.5).snapshot(), "loss")
    assert png is not None and png.startswith(PNG_MAGIC)
