"""`JobMonitor`: a live notebook view of one job, built from ipywidgets 8 core controls.

Two daemon threads (never asyncio tasks: ipykernel 7 may stop those when the
cell ends) do the work:

- the *follower* folds the events that exist (`job.snapshot()`), then iterates
  `job.follow(after=last_seq)` and applies each event to the monitor's
  `JobSnapshot`; on an error it says so in the widget and resumes from the last
  sequence number after a backoff;
- the *renderer* redraws the widgets at most `max_updates_per_s` times a second,
  coalescing bursts (a leading redraw at once, then one trailing redraw per
  interval, so a quiet job still shows its latest event), redraws the chart only
  when the charted series changed, and makes a final redraw when the job ends.

The widgets, their CSS classes (for browser tests) and how a redraw fills them are
`monitor_widgets.py`'s; what a redraw shows is computed by `monitor_view.py`. All the
HTML comes from `snapshot_html.py`, which also gives the static copy the notebook keeps
and the gateway's /ui job page.

Example:
    >>> monitor = job.monitor(total_steps=1000)  # doctest: +SKIP
    >>> monitor  # the last expression of a cell shows the live widget  # doctest: +SKIP
    >>> monitor.wait(timeout=600).state  # doctest: +SKIP
    <JobState.SUCCEEDED: 'SUCCEEDED'>
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from air_sdk.client._http import retrying
from air_sdk.errors import AuthError, JobTimeoutError, NotFoundError
from air_sdk.notebook import snapshot_html
from air_sdk.notebook.chart import render_chart_png
from air_sdk.notebook.display_copies import DisplayCopies
from air_sdk.notebook.monitor_view import MonitorView, chart_key_of, chosen_metric, monitor_view
from air_sdk.notebook.monitor_widgets import MonitorWidgets
from air_sdk.schema.events import Event
from air_sdk.schema.snapshot import JobSnapshot

__all__ = ["JobMonitor", "MonitoredJob"]

log = logging.getLogger(__name__)

#: how long starting a monitor waits for the events that already exist, so the first
#: display shows the job as it is (the fold goes on in the background after that)
INITIAL_FOLD_WAIT_S = 1.0
#: the first pause (at most; jittered) before following again after an error; it doubles
#: up to the maximum (the client's retry policy, `air_sdk.client._http.retrying`)
FIRST_RETRY_BACKOFF_S = 1.0
#: the longest pause between attempts to get the event stream back
MAX_RETRY_BACKOFF_S = 30.0
CHART_WIDTH_PX = 640
CHART_HEIGHT_PX = 240

#: errors that following again cannot fix
_FINAL_ERRORS = (AuthError, NotFoundError)


class _Stopped(Exception):
    """The monitor was closed while it waited to follow again."""


class MonitoredJob(Protocol):
    """What the monitor needs of a job: `air_sdk.client.Job`, or a fake in tests."""

    id: str

    def snapshot(self) -> JobSnapshot: ...

    def follow(self, after: int = 0) -> Iterator[Event]: ...

    def cancel(self) -> Any: ...

    def record(self) -> Any: ...


class JobMonitor:
    """A live view of a job: state, progress, metrics chart, throughput, utilization,
    checkpoints, failure, per-rank logs and a Cancel button.

    Tokens/s and MFU come from the job itself: a script that logs `tokens=` per step
    (`air.log(step=..., loss=..., tokens=N)`) gets them measured by the worker
    runtime, and the monitor shows them (and can chart them) with no option here.

    Args:
        job: the job to follow (`air_sdk.client.Job`, or anything `MonitoredJob`).
        total_steps: the run's length, for the progress bar and ETA; without it the
            monitor uses a logged scalar named `total_steps`.
        max_updates_per_s: redraws per second at most (the kernel sends every
            change to the browser; 2-4 is plenty).
        start: start following at once (else call `start()`).

    Example:
        >>> from air_sdk.notebook import JobMonitor
        >>> monitor = JobMonitor(client.job("train-5d41402a"), total_steps=500)  # doctest: +SKIP
        >>> monitor  # doctest: +SKIP
    """

    def __init__(
        self,
        job: MonitoredJob,
        *,
        total_steps: int | None = None,
        max_updates_per_s: float = 3.0,
        start: bool = True,
    ) -> None:
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, not {total_steps}")
        if not max_updates_per_s > 0 or not math.isfinite(max_updates_per_s):
            raise ValueError(
                f"max_updates_per_s must be a positive number, not {max_updates_per_s}"
            )
        self.job = job
        self.total_steps = total_steps
        self._min_interval_s = 1.0 / max_updates_per_s
        #: redraws so far (each one pushes changed widget values to the browser)
        self.num_renders = 0

        self._snapshot = JobSnapshot(job_id=job.id)
        self._name: str | None = None
        # One lock guards the snapshot and the flags below; the condition wakes the renderer.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._folded = threading.Event()
        self._dirty = True
        self._follow_done = False
        self._rendered_final = False
        self._live = False
        self._error: str | None = None
        self._metric: str | None = None
        self._log_rank: int | None = None
        self._chart_key: tuple[Any, ...] | None = None
        self._chart_png: bytes | None = None
        self._last_render = -math.inf
        self._cancel_clicked = False
        self._closed = False
        self._follower: threading.Thread | None = None
        self._renderer: threading.Thread | None = None
        #: where the monitor was displayed: its saved copies get the final state
        self._copies = DisplayCopies()
        self._face = MonitorWidgets(
            on_cancel=self._on_cancel_click,
            on_metric=lambda metric: self._on_choice(metric=metric),
            on_log_rank=lambda rank: self._on_choice(log_rank=rank),
        )
        #: the live widget (`air-monitor`); `monitor_widgets.py` lists its parts' classes
        self.widget = self._face.root
        self._face.apply(self._view(), cancel_clicked=False)
        if start:
            self.start()

    # -- public ------------------------------------------------------------------

    @property
    def snapshot(self) -> JobSnapshot:
        """A copy of the current fold of the job's events."""
        with self._lock:
            return self._snapshot.model_copy(deep=True)

    def start(self) -> None:
        """Start following the job (done by the constructor unless `start=False`).

        Waits up to `INITIAL_FOLD_WAIT_S` for the events that already exist, so
        the first display shows the job as it is.
        """
        if self._closed:
            raise RuntimeError("this monitor was closed; make a new one with job.monitor()")
        if self._follower is not None:
            return
        self._live = True
        self._follower = threading.Thread(
            target=self._follow_loop, name=f"air-monitor-follow-{self.job.id}", daemon=True
        )
        self._renderer = threading.Thread(
            target=self._render_loop, name=f"air-monitor-render-{self.job.id}", daemon=True
        )
        self._follower.start()
        self._renderer.start()
        self._folded.wait(INITIAL_FOLD_WAIT_S)

    def wait(self, timeout: float | None = None) -> JobSnapshot:
        """Block until the job has ended and the monitor drew its final state (or
        `close()` was called); return the snapshot.

        Raises `JobTimeoutError` when `timeout` seconds pass first. While a cell
        waits, the kernel is busy and the Cancel button cannot be clicked.

        Example:
            >>> monitor.wait(timeout=600).step  # doctest: +SKIP
            1000
        """
        if self._renderer is None:
            raise RuntimeError("this monitor was made with start=False; call start() first")
        self._renderer.join(timeout)
        if self._renderer.is_alive():
            state = self._snapshot.state.value
            raise JobTimeoutError(
                f"job {self.job.id} is still {state} after {timeout:g} s;"
                " wait longer, or cancel it with the Cancel button or job.cancel()"
            )
        return self.snapshot

    def close(self) -> None:
        """Stop following and close the widgets (idempotent).

        A follower blocked reading the stream ends at its next event; it is a
        daemon thread, so it never keeps the kernel alive.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        renderer = self._renderer
        if renderer is not None and renderer is not threading.current_thread():
            renderer.join(timeout=5.0)
        self._face.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        # The live widget, plus a static copy for exports (nbconvert, GitHub: no widget
        # state) and text for terminals. Front ends pick the richest they can show.
        with self._lock:
            bundle: dict[str, Any] = {
                "text/plain": self._text(),
                "text/html": snapshot_html.render_html(
                    self._snapshot,
                    name=self._name,
                    chart_png=self._current_chart_png(),
                    total_steps=self.total_steps,
                ),
            }
        widget_repr = getattr(self.widget, "_repr_mimebundle_", None)  # None once closed
        if callable(widget_repr):
            view = widget_repr(**kwargs) or {}
            key = "application/vnd.jupyter.widget-view+json"
            if key in view:
                bundle[key] = view[key]
        return bundle

    def _ipython_display_(self) -> None:
        # Displayed under a display id, so the final redraw can update the static copy a
        # saved notebook keeps (else it stays at the state it was displayed in).
        self._copies.show(self._repr_mimebundle_())
        if self._rendered_final:  # ended while it was being displayed
            self._copies.update(self._repr_mimebundle_())

    def __repr__(self) -> str:
        with self._lock:
            return self._text()

    # -- the user's picks and clicks -------------------------------------------------

    def _on_cancel_click(self) -> None:
        # Runs on the kernel's shell thread: an error must show in the widget, since
        # ipywidgets only logs exceptions of callbacks.
        self._cancel_clicked = True
        self._face.cancelling(True)
        try:
            self.job.cancel()
        except Exception as exc:
            self._cancel_clicked = False
            self._face.cancelling(False)
            self._set_error(f"cancel failed: {type(exc).__name__}: {exc}")

    def _on_choice(self, *, metric: str | None = None, log_rank: int | None = None) -> None:
        with self._changed:
            if metric is not None:
                self._metric = metric
            if log_rank is not None:
                self._log_rank = log_rank
            if self._live:
                self._dirty = True
                self._changed.notify_all()
                return
        # The job has ended (or the monitor never started): draw here and now.
        if not self._closed:
            self._render_safely()

    # -- threads -----------------------------------------------------------------

    def _follow_loop(self) -> None:
        # The client's one retry policy, never giving up while the monitor is open: a
        # gateway restart of minutes shows as an error in the widget, then heals.
        policy = retrying(
            None,
            retry_on=(Exception,),
            never_on=(*_FINAL_ERRORS, _Stopped),
            multiplier_s=FIRST_RETRY_BACKOFF_S,
            max_wait_s=MAX_RETRY_BACKOFF_S,
            on_retry=self._on_retry,
            sleep=self._sleep_unless_stopped,
        )
        try:
            for attempt in policy:
                with attempt:
                    if not self._folded.is_set():
                        self._initial_fold()
                    if self._snapshot.state.terminal:
                        return
                    for event in self.job.follow(after=self._snapshot.last_seq):
                        with self._changed:
                            self._snapshot.apply(event)
                            self._error = None
                            self._dirty = True
                            self._changed.notify_all()
                        if self._stop.is_set() or self._snapshot.state.terminal:
                            return
                    return  # follow() ends only with the job
        except _FINAL_ERRORS as exc:
            self._set_error(f"stopped following job {self.job.id}: {exc}")
        except _Stopped:
            pass
        finally:
            self._folded.set()
            with self._changed:
                self._follow_done = True
                self._changed.notify_all()

    def _on_retry(self, exc: BaseException, wait_s: float) -> None:
        log.debug("monitor of %s: follow failed", self.job.id, exc_info=exc)
        self._set_error(
            f"lost the event stream ({type(exc).__name__}: {exc}); retrying in {wait_s:.0f} s"
        )

    def _sleep_unless_stopped(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise _Stopped

    def _initial_fold(self) -> None:
        name: str | None = None
        try:
            name = getattr(self.job.record(), "name", None)
        except _FINAL_ERRORS:
            raise
        except Exception:
            log.debug("monitor of %s: no record for the name", self.job.id, exc_info=True)
        folded = self.job.snapshot()
        with self._changed:
            if folded.last_seq >= self._snapshot.last_seq:
                self._snapshot = folded
            self._name = name
            self._dirty = True
            self._changed.notify_all()
        self._folded.set()

    def _render_loop(self) -> None:
        try:
            while True:
                with self._changed:
                    while not (self._dirty or self._follow_done or self._stop.is_set()):
                        self._changed.wait()
                    if self._stop.is_set() or (self._rendered_final and not self._dirty):
                        # Under the lock: a later pick (metric, rank) sees `_live` False
                        # and draws itself instead of waiting for this thread.
                        self._live = False
                        return
                    ending = self._follow_done
                    if not ending:
                        wait_s = self._last_render + self._min_interval_s - time.monotonic()
                        if wait_s > 0:
                            self._changed.wait(wait_s)
                            continue
                    self._dirty = False
                self._render_safely()
                if ending:
                    self._rendered_final = True
                    self._copies.update(self._repr_mimebundle_())
        finally:
            with self._changed:
                self._live = False

    def _set_error(self, message: str) -> None:
        with self._changed:
            self._error = message
            self._dirty = True
            self._changed.notify_all()
        if not self._live and not self._closed:
            self._render_safely()

    # -- drawing -----------------------------------------------------------------

    def _render_safely(self) -> None:
        try:
            with self._lock:
                view = self._view()
            if view.chart_source is not None:
                # Drawn outside the lock (a chart takes 0.05-0.3 s) from a copy of the
                # series, so the follower keeps applying events meanwhile.
                png = None
                if view.metric is not None:
                    png = render_chart_png(
                        view.chart_source,
                        view.metric,
                        width_px=CHART_WIDTH_PX,
                        height_px=CHART_HEIGHT_PX,
                    )
                with self._lock:
                    self._chart_key, self._chart_png = view.chart_key, png
                view.chart_png = png
            self._face.apply(view, cancel_clicked=self._cancel_clicked)
        except Exception as exc:
            # A drawing bug must not end following, nor pass unseen.
            log.warning("monitor of %s: redraw failed", self.job.id, exc_info=True)
            self._face.show_error(f"the monitor could not redraw: {exc!r}")
        finally:
            self._last_render = time.monotonic()
            self.num_renders += 1

    def _current_chart_png(self) -> bytes | None:
        metric = chosen_metric(self._snapshot, self._metric)
        if metric is None:
            return None
        if self._chart_key == chart_key_of(self._snapshot, metric):
            return self._chart_png
        return render_chart_png(
            self._snapshot, metric, width_px=CHART_WIDTH_PX, height_px=CHART_HEIGHT_PX
        )

    def _view(self) -> MonitorView:
        return monitor_view(
            self._snapshot,
            name=self._name,
            total_steps=self.total_steps,
            picked_metric=self._metric,
            picked_log_rank=self._log_rank,
            drawn_chart_key=self._chart_key,
            chart_png=self._chart_png,
            error=self._error,
        )

    def _text(self) -> str:
        return snapshot_html.render_text(
            self._snapshot,
            name=self._name,
            total_steps=self.total_steps,
        )
