"""JobMonitor driven by a fake job whose event stream the test feeds.

Widgets run headless (no kernel, no comm): the tests read widget values, found
by the CSS classes a browser test uses, after the follower thread applied events.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import ipywidgets as widgets
import pytest

from air_sdk.client.job import Job, is_terminal_event
from air_sdk.errors import JobTimeoutError, NotFoundError, TransportError
from air_sdk.notebook import monitor as monitor_module
from air_sdk.notebook.chart import PNG_MAGIC
from air_sdk.notebook.monitor import JobMonitor
from air_sdk.schema import Event, JobSnapshot, JobState

JOB = "j-mon"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class FakeJob:
    """follow()/snapshot()/cancel()/record() over an event log the test writes.

    `existing` events are in the log before the monitor starts (snapshot() folds
    them); `push` appends one that follow() then yields. Putting an exception in
    the feed makes follow() raise it; None ends the stream.
    """

    def __init__(self, existing: list[Event] | None = None) -> None:
        self.id = JOB
        self.existing = list(existing or [])
        self.seq = len(self.existing)
        self.feed: queue.Queue[Event | BaseException | None] = queue.Queue()
        self.follow_calls: list[int] = []
        self.num_cancels = 0
        self.cancel_error: Exception | None = None

    def record(self) -> Any:
        return SimpleNamespace(name="demo")

    def snapshot(self) -> JobSnapshot:
        return JobSnapshot.fold(self.id, self.existing)

    def follow(self, after: int = 0) -> Iterator[Event]:
        self.follow_calls.append(after)
        while True:
            item = self.feed.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if item.seq <= after:
                continue
            yield item
            if is_terminal_event(item):
                return

    def cancel(self) -> None:
        self.num_cancels += 1
        if self.cancel_error is not None:
            raise self.cancel_error

    def push(self, type_: str, rank: int | None = None, **data: object) -> Event:
        self.seq += 1
        event = Event(
            seq=self.seq, job_id=JOB, ts=float(self.seq), type=type_, rank=rank, data=data
        )
        self.feed.put(event)
        return event

    def state(self, state: JobState, **data: object) -> Event:
        return self.push("state", state=state.value, **data)

    def step(self, step: int, **values: float) -> Event:
        point = {"step": step, "ts": float(step), "values": values}
        return self.push("metrics", rank=0, points=[point])

    def start_running(self) -> None:
        self.state(JobState.RUNNING)
        self.push("attempt", attempt=1, phase="started")


def existing_log(num_steps: int) -> list[Event]:
    job = FakeJob()
    job.start_running()
    for step in range(1, num_steps + 1):
        job.step(step, loss=1.0 / step)
    events = []
    while not job.feed.empty():
        item = job.feed.get()
        assert isinstance(item, Event)
        events.append(item)
    return events


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def find(root: widgets.Widget, css_class: str) -> Any:
    """The one widget under `root` tagged with `css_class` (as a browser test finds it)."""
    found = []
    stack = [root]
    while stack:
        widget = stack.pop()
        if css_class in getattr(widget, "_dom_classes", ()):
            found.append(widget)
        stack.extend(getattr(widget, "children", ()))
    assert len(found) == 1, f"{len(found)} widgets with class {css_class}"
    return found[0]


def text_of(widget: Any) -> str:
    import re

    return re.sub(r"<[^>]+>", "", widget.value)


@pytest.fixture
def make_monitor() -> Iterator[Callable[..., tuple[JobMonitor, FakeJob]]]:
    made: list[tuple[JobMonitor, FakeJob]] = []

    def make(job: FakeJob | None = None, **options: Any) -> tuple[JobMonitor, FakeJob]:
        job = job or FakeJob()
        monitor = JobMonitor(job, **options)
        made.append((monitor, job))
        return monitor, job

    yield make
    for monitor, job in made:
        monitor.close()
        job.feed.put(None)  # let a follower blocked on the feed return


# -- what the widgets show --------------------------------------------------------


def test_state_step_and_progress_follow_the_events(make_monitor) -> None:
    monitor, job = make_monitor(total_steps=10)
    root = monitor.widget
    assert "air-monitor" in root._dom_classes
    assert "QUEUED" in text_of(find(root, "air-state"))

    job.start_running()
    for step in range(1, 6):
        job.step(step, loss=1.0 / step)
    step_label = find(root, "air-step")
    wait_until(lambda: "step 5" in text_of(step_label), "step 5 on the label")
    badge = text_of(find(root, "air-state"))
    assert "RUNNING" in badge and "attempt 1" in badge and "demo" in badge
    progress = find(root, "air-progress")
    assert isinstance(progress, widgets.IntProgress)
    assert (progress.value, progress.max) == (5, 10)
    assert "step 5 / 10 (50%)" in step_label.value
    assert "ETA" in step_label.value


def test_progress_total_from_a_logged_total_steps(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    job.step(1, loss=1.0, total_steps=200)
    job.step(50, loss=0.5, total_steps=200)
    progress = find(monitor.widget, "air-progress")
    wait_until(lambda: (progress.value, progress.max) == (50, 200), "progress 50/200")


def test_without_a_total_the_bar_waits_for_success(make_monitor) -> None:
    monitor, job = make_monitor()
    progress = find(monitor.widget, "air-progress")
    job.start_running()
    job.step(7, loss=0.5)
    wait_until(lambda: "step 7" in text_of(find(monitor.widget, "air-step")), "step 7")
    assert progress.layout.display == "none"  # not an empty bar reading "0% done"
    job.state(JobState.SUCCEEDED)
    monitor.wait(timeout=10)
    assert progress.layout.display is None
    assert progress.value == progress.max  # the browser draws width: 100%


def test_existing_events_are_folded_before_following(make_monitor) -> None:
    events = existing_log(num_steps=7)
    monitor, job = make_monitor(FakeJob(existing=events))
    # start() waits for the fold, so the first display already shows the job as it is.
    assert monitor.snapshot.step == 7
    assert "RUNNING" in monitor._repr_mimebundle_()["text/plain"]
    wait_until(lambda: job.follow_calls == [len(events)], "follow after the fold")
    wait_until(lambda: "step 7" in text_of(find(monitor.widget, "air-step")), "step 7")


def test_chart_and_metric_dropdown(make_monitor) -> None:
    monitor, job = make_monitor()
    chart = find(monitor.widget, "air-chart")
    dropdown = find(monitor.widget, "air-metric")
    assert isinstance(chart, widgets.Image) and chart.format == "png"
    assert bytes(chart.value) == b""  # nothing to draw yet
    job.start_running()
    for step in range(1, 11):
        job.step(step, loss=1.0 / step, lr=0.1 * step)
    wait_until(lambda: bytes(chart.value).startswith(PNG_MAGIC), "a chart")
    wait_until(lambda: "step 10" in text_of(find(monitor.widget, "air-step")), "step 10")
    assert list(dropdown.options) == ["loss", "lr"]
    assert dropdown.value == "loss"
    loss_png = bytes(chart.value)

    dropdown.value = "lr"  # what a user's pick does
    wait_until(lambda: bytes(chart.value) != loss_png, "the lr chart")
    # The pick survives new metrics appearing.
    job.step(11, loss=0.05, lr=1.1, acc=0.9)
    wait_until(lambda: "acc" in dropdown.options, "a new metric in the dropdown")
    assert dropdown.value == "lr"


def test_chart_redrawn_only_when_its_series_changes(make_monitor, monkeypatch) -> None:
    drawn: list[str] = []
    real = monitor_module.render_chart_png

    def counting(snapshot: JobSnapshot, metric: str, **kwargs: Any) -> bytes | None:
        drawn.append(metric)
        return real(snapshot, metric, **kwargs)

    monkeypatch.setattr(monitor_module, "render_chart_png", counting)
    monitor, job = make_monitor()
    job.start_running()
    job.step(1, loss=1.0)
    wait_until(lambda: drawn, "a chart")
    num_drawn = len(drawn)
    # Log lines and utilization change the page, not the loss series.
    job.push("log", rank=0, lines=["hello"])
    job.push("util", rank=0, samples=[{"node": "n0", "device": "cpu", "ts": 1.0, "util_pct": 5}])
    wait_until(lambda: "n0" in find(monitor.widget, "air-util").value, "utilization")
    assert len(drawn) == num_drawn


def test_throughput_and_mfu_come_from_the_job_with_no_option(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    job.step(0, loss=1.0, samples=32, tokens=4096)
    # what the worker runtime adds to a point logged with tokens=
    job.step(20, loss=0.5, samples=32, tokens=4096, tokens_per_s=32768.0, mfu=0.1)
    metrics = find(monitor.widget, "air-metrics")
    wait_until(lambda: "MFU 10.0%" in metrics.value, "MFU")
    assert "32 samples/s" in metrics.value and "32.77k tokens/s" in metrics.value
    # shown as throughput, not again among the logged values
    assert "tokens_per_s" not in metrics.value and ">mfu<" not in metrics.value
    assert {"tokens_per_s", "mfu"} <= set(find(monitor.widget, "air-metric").options)


def test_utilization_and_checkpoint_tables(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    sample = {"node": "node-a", "device": "gpu0", "ts": 1.0, "util_pct": 87.0, "power_w": 250.0}
    job.push("util", rank=0, samples=[sample])
    job.push(
        "checkpoint",
        step=100,
        path="/ck/100",
        world_size=2,
        size_bytes=2048,
        num_files=3,
        blocked_s=0.05,
        durable_s=0.5,
    )
    checkpoints = find(monitor.widget, "air-checkpoints")
    wait_until(lambda: "/ck/100" in checkpoints.value, "the checkpoint row")
    assert "0.50 s" in checkpoints.value and "2.0 KiB" in checkpoints.value
    util = find(monitor.widget, "air-util").value
    assert "node-a" in util and "gpu0" in util and "87%" in util and "250 W" in util


def test_exports_show_each_tracker_and_how_it_went(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    exports = find(monitor.widget, "air-exports")
    assert text_of(exports) == ""  # a job that exports nowhere shows no line
    job.push("export", to="tensorboard", state="running", location="/h/exports/j/tensorboard")
    job.push("export", to="mlflow", state="running", location="http://127.0.0.1:5000")
    wait_until(lambda: "mlflow" in exports.value, "the exports' lines")
    job.push("export", to="tensorboard", state="done", location="/h/exports/j/tensorboard")
    job.push("export", to="mlflow", state="failed", error="the server <refused> it")
    wait_until(lambda: "failed" in exports.value, "the failed export")
    lines = re.findall(r"<div[^>]*>([^<]*)</div>", exports.value)
    assert lines == [
        "export to mlflow: failed: the server &lt;refused&gt; it",
        "export to tensorboard: done, /h/exports/j/tensorboard",
    ]
    # the text a terminal front end shows says the same
    assert "export to tensorboard: done, /h/exports/j/tensorboard" in repr(monitor)


def test_failure_and_escaped_logs_per_rank(make_monitor) -> None:
    monitor, job = make_monitor()
    failure_area = find(monitor.widget, "air-failure")
    assert failure_area.layout.display == "none"
    job.start_running()
    job.push("log", rank=0, lines=["rank 0 says hi"])
    job.push("log", rank=1, lines=["<script>alert(1)</script>", "Traceback ..."])
    failure = {"attempt": 1, "reason": "rank 1 exited", "rank": 1, "exit_code": 3}
    job.state(JobState.FAILED, reason="max restarts reached", failure=failure)
    monitor.wait(timeout=10)

    assert failure_area.layout.display is None
    assert "rank 1" in failure_area.value and "exit code 3" in failure_area.value
    logs = find(monitor.widget, "air-logs")
    ranks = find(monitor.widget, "air-log-rank")
    assert [value for _, value in ranks.options] == [0, 1]
    assert ranks.value == 1  # the failing rank's log first
    assert "<script>" not in logs.value
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in logs.value

    ranks.value = 0  # after the job ended, a pick still redraws
    assert "rank 0 says hi" in logs.value


# -- cancel, end, close -----------------------------------------------------------


def test_cancel_button_cancels_and_is_disabled_once_terminal(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    button = find(monitor.widget, "air-cancel")
    wait_until(lambda: "RUNNING" in text_of(find(monitor.widget, "air-state")), "RUNNING")
    assert not button.disabled

    button.click()
    assert job.num_cancels == 1
    assert button.disabled  # no double cancel while the job winds down

    job.state(JobState.CANCELLED, reason="cancelled by the user")
    snapshot = monitor.wait(timeout=10)
    assert snapshot.state is JobState.CANCELLED
    assert "CANCELLED" in text_of(find(monitor.widget, "air-state"))
    assert button.disabled


def test_a_failed_cancel_is_shown_and_can_be_retried(make_monitor) -> None:
    monitor, job = make_monitor()
    job.cancel_error = TransportError("gateway unreachable")
    button = find(monitor.widget, "air-cancel")
    button.click()
    assert not button.disabled
    error = find(monitor.widget, "air-error")
    wait_until(lambda: "cancel failed" in error.value, "the cancel error")
    assert "gateway unreachable" in error.value


def test_the_monitor_ends_with_the_job(make_monitor) -> None:
    monitor, job = make_monitor(total_steps=3)
    job.start_running()
    for step in (1, 2, 3):
        job.step(step, loss=1.0 / step)
    job.state(JobState.SUCCEEDED)
    snapshot = monitor.wait(timeout=10)
    assert snapshot.state is JobState.SUCCEEDED and snapshot.step == 3
    assert monitor._follower is not None and monitor._renderer is not None
    monitor._follower.join(timeout=10)
    assert not monitor._follower.is_alive() and not monitor._renderer.is_alive()
    # The final redraw shows the end state.
    assert "SUCCEEDED" in text_of(find(monitor.widget, "air-state"))
    assert find(monitor.widget, "air-progress").bar_style == "success"
    assert find(monitor.widget, "air-cancel").disabled


def test_wait_times_out_on_a_running_job(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    with pytest.raises(JobTimeoutError, match="still"):
        monitor.wait(timeout=0.05)


def test_close_stops_following_and_closes_the_widgets(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    job.step(1, loss=1.0)
    wait_until(lambda: monitor.snapshot.step == 1, "step 1")
    monitor.close()
    monitor.wait(timeout=10)  # returns: the monitor is done
    assert monitor.closed
    assert monitor.widget.comm is None
    assert find(monitor.widget, "air-state").comm is None
    renders = monitor.num_renders
    job.step(2, loss=0.5)  # the follower sees its stop flag at the next event ...
    assert monitor._follower is not None
    monitor._follower.join(timeout=10)
    assert not monitor._follower.is_alive()  # ... and returns
    assert monitor.num_renders == renders
    monitor.close()  # idempotent
    # A closed monitor still has a static view and text.
    assert set(monitor._repr_mimebundle_()) == {"text/plain", "text/html"}


def test_renders_are_coalesced(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    for step in range(1, 1001):
        job.step(step, loss=1.0 / step)
    job.state(JobState.SUCCEEDED)
    snapshot = monitor.wait(timeout=60)
    assert snapshot.step == 1000
    assert monitor.num_renders < 50
    assert "step 1000" in text_of(find(monitor.widget, "air-step"))


def test_a_quiet_job_still_shows_its_latest_event(make_monitor) -> None:
    # Events inside one render interval are drawn by a trailing redraw, not left
    # waiting for the next event (which may be minutes away).
    monitor, job = make_monitor(max_updates_per_s=2.0)
    job.start_running()
    job.step(1, loss=1.0)
    job.step(2, loss=0.9)
    job.state(JobState.RESTARTING, reason="rank 0 died")
    state = find(monitor.widget, "air-state")
    wait_until(lambda: "RESTARTING" in text_of(state), "the restart on the badge")


# -- errors -----------------------------------------------------------------------


def test_stream_errors_are_shown_and_following_resumes(make_monitor, monkeypatch) -> None:
    monkeypatch.setattr(monitor_module, "FIRST_RETRY_BACKOFF_S", 0.01)
    monitor, job = make_monitor()
    job.start_running()
    job.step(1, loss=1.0)
    job.feed.put(TransportError("the gateway went away"))
    error = find(monitor.widget, "air-error")
    wait_until(lambda: "the gateway went away" in error.value, "the error in the widget")
    assert error.layout.display is None
    assert "lost the event stream" in error.value

    job.step(2, loss=0.5)
    wait_until(lambda: "step 2" in text_of(find(monitor.widget, "air-step")), "step 2")
    assert job.follow_calls == [0, 3]  # resumed after the last event it applied
    wait_until(lambda: error.layout.display == "none", "the error cleared")


def test_a_missing_job_stops_the_monitor(make_monitor) -> None:
    monitor, job = make_monitor()
    job.feed.put(NotFoundError(404, "no job j-mon"))
    monitor.wait(timeout=10)
    error = find(monitor.widget, "air-error")
    assert "stopped following" in error.value and "no job j-mon" in error.value


def test_a_drawing_bug_is_shown_not_lost(make_monitor, monkeypatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("kaboom")

    monitor, job = make_monitor()
    monkeypatch.setattr(monitor_module.snapshot_html, "utilization_html", broken)
    job.start_running()
    error = find(monitor.widget, "air-error")
    wait_until(lambda: "kaboom" in error.value, "the drawing error")
    monkeypatch.undo()
    job.state(JobState.SUCCEEDED)
    assert monitor.wait(timeout=10).state is JobState.SUCCEEDED


# -- display ----------------------------------------------------------------------


def test_mimebundle_has_widget_html_and_text(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    for step in range(1, 4):
        job.step(step, loss=1.0 / step)
    job.state(JobState.SUCCEEDED)
    monitor.wait(timeout=10)
    bundle = monitor._repr_mimebundle_(include=None, exclude=None)
    assert set(bundle) == {WIDGET_VIEW, "text/html", "text/plain"}
    assert bundle[WIDGET_VIEW]["model_id"] == monitor.widget.model_id
    assert "SUCCEEDED" in bundle["text/html"]
    assert "data:image/png;base64," in bundle["text/html"]  # the chart, for static exports
    assert bundle["text/plain"] == repr(monitor)
    assert "SUCCEEDED" in repr(monitor) and "step 3" in repr(monitor)


def test_snapshot_is_a_copy(make_monitor) -> None:
    monitor, job = make_monitor()
    job.start_running()
    job.state(JobState.SUCCEEDED)
    snapshot = monitor.wait(timeout=10)
    snapshot.latest["loss"] = 123.0
    assert "loss" not in monitor.snapshot.latest


# -- construction -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"total_steps": 0}, "total_steps"),
        ({"max_updates_per_s": 0}, "max_updates_per_s"),
    ],
)
def test_bad_options_say_what_to_change(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobMonitor(FakeJob(), **options)


def test_start_false_follows_nothing_until_started() -> None:
    job = FakeJob(existing=existing_log(num_steps=2))
    monitor = JobMonitor(job, start=False)
    try:
        assert job.follow_calls == []
        with pytest.raises(RuntimeError, match="start"):
            monitor.wait(timeout=1)
        monitor.start()
        assert monitor.snapshot.step == 2
    finally:
        monitor.close()
        job.feed.put(None)


def test_job_monitor_method_builds_a_monitor() -> None:
    job = Job(client=None, record=JOB)  # type: ignore[arg-type]  # start=False: no request
    monitor = job.monitor(total_steps=100, start=False)
    try:
        assert isinstance(monitor, JobMonitor)
        assert monitor.job is job and monitor.total_steps == 100
    finally:
        monitor.close()


def test_threads_are_daemons(make_monitor) -> None:
    monitor, _ = make_monitor()
    assert monitor._follower is not None and monitor._renderer is not None
    assert monitor._follower.daemon and monitor._renderer.daemon
    assert {monitor._follower.name, monitor._renderer.name} <= {
        t.name for t in threading.enumerate()
    }
