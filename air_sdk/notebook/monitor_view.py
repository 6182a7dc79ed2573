"""What one redraw of the live monitor shows, computed from a `JobSnapshot`: pure,
so `monitor.py` only assigns the values to its widgets (under its lock, from its
render thread) and this part is tested without widgets.

Example:
    >>> view = monitor_view(JobSnapshot(job_id="j"), name="demo")
    >>> view.progress_shown, view.log_ranks, view.terminal
    (False, [], False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from air_sdk.notebook import snapshot_html
from air_sdk.schema.snapshot import JobSnapshot
from air_sdk.schema.state import JobState

__all__ = ["MonitorView", "chart_key_of", "chosen_metric", "monitor_view"]

_BAR_STYLES = {
    JobState.SUCCEEDED: "success",
    JobState.FAILED: "danger",
    JobState.RESTARTING: "warning",
    JobState.CANCELLED: "warning",
}


@dataclass
class MonitorView:
    """Every widget value of one redraw, computed from the snapshot under the lock."""

    state_html: str
    step_html: str
    progress_max: int
    progress_value: int
    bar_style: str
    progress_shown: bool
    metrics_html: str
    metric_options: list[str]
    metric: str | None
    chart_key: tuple[Any, ...]
    #: a copy of what the chart needs when its series changed since the last drawing
    chart_source: JobSnapshot | None
    chart_png: bytes | None
    util_html: str
    checkpoints_html: str
    exports_html: str
    failure_html: str
    log_ranks: list[int]
    log_rank: int | None
    logs_html: str
    error: str | None
    terminal: bool


def chart_key_of(snap: JobSnapshot, metric: str | None) -> tuple[Any, ...]:
    """What the chart of `metric` depends on: it is redrawn only when this changes."""
    points = snap.series.get(metric, []) if metric else []
    return (
        metric,
        len(points),
        points[0] if points else None,
        points[-1] if points else None,
        tuple(snap.restarts_at_step),
        len(snap.checkpoints),
        snap.total_steps,
    )


def chosen_metric(snap: JobSnapshot, picked: str | None) -> str | None:
    """The metric to chart: the one picked, while it has points; else the default."""
    if picked is not None and picked in snap.series:
        return picked
    return snapshot_html.default_metric(snap)


def monitor_view(
    snap: JobSnapshot,
    *,
    name: str | None = None,
    total_steps: int | None = None,
    picked_metric: str | None = None,
    picked_log_rank: int | None = None,
    drawn_chart_key: tuple[Any, ...] | None = None,
    chart_png: bytes | None = None,
    error: str | None = None,
) -> MonitorView:
    """Every widget value of one redraw. `drawn_chart_key` and `chart_png` are the
    chart drawn last: a copy of what the chart needs is made only when it changed."""
    total = snapshot_html.resolve_total_steps(snap, total_steps)
    progress_max = total or 1
    if snap.state is JobState.SUCCEEDED:
        progress_value = progress_max  # done is done, whatever the last logged step
    elif total is not None:
        progress_value = min(snap.steps_done or 0, total)
    else:
        progress_value = 0

    metric = chosen_metric(snap, picked_metric)
    key = chart_key_of(snap, metric)
    chart_source = None
    if key != drawn_chart_key:
        points = list(snap.series.get(metric, [])) if metric is not None else []
        chart_source = snap.model_copy(
            update={
                "series": {metric: points} if metric is not None else {},
                "restarts_at_step": list(snap.restarts_at_step),
                "checkpoints": list(snap.checkpoints),
                "total_steps": total,  # the chart's step axis runs to it
            }
        )

    log_ranks = sorted(snap.log_tail)
    failing_rank = snap.failure.rank if snap.failure is not None else None
    log_rank: int | None = log_ranks[0] if log_ranks else None
    if picked_log_rank is not None and picked_log_rank in snap.log_tail:
        log_rank = picked_log_rank
    elif failing_rank is not None and failing_rank in snap.log_tail:
        log_rank = failing_rank  # what a user looks at first after a failure
    logs = snap.log_tail.get(log_rank, []) if log_rank is not None else []

    return MonitorView(
        state_html=snapshot_html.badge_html(snap, name=name),
        step_html=snapshot_html.escape(snapshot_html.progress_text(snap, total_steps=total_steps)),
        progress_max=progress_max,
        progress_value=progress_value,
        bar_style=_BAR_STYLES.get(snap.state, ""),
        # Without a total an empty bar would read "0% done": the step label and
        # the rate carry the progress until the job has succeeded.
        progress_shown=total is not None or snap.state is JobState.SUCCEEDED,
        metrics_html=snapshot_html.metrics_html(snap),
        metric_options=snapshot_html.metric_names(snap),
        metric=metric,
        chart_key=key,
        chart_source=chart_source,
        chart_png=chart_png,
        util_html=snapshot_html.utilization_html(snap),
        checkpoints_html=snapshot_html.checkpoints_html(snap),
        exports_html=snapshot_html.exports_html(snap),
        failure_html=snapshot_html.failure_html(snap),
        log_ranks=log_ranks,
        log_rank=log_rank,
        logs_html=snapshot_html.logs_html(logs) if log_rank is not None else "",
        error=error,
        terminal=snap.state.terminal,
    )
