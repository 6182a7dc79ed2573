"""The monitor's face: its ipywidgets 8 controls, the CSS class of each (for browser
tests), and how one redraw (`MonitorView`) is assigned to them. The threads that follow
the job and decide when to redraw are `monitor.py`'s; this part only builds the widgets
and fills them. Values are only ever assigned (never `with out:` from a thread), and
assigning an unchanged value sends nothing to the browser (traitlets compares).

CSS classes: `air-monitor` (root), `air-state`, `air-step`, `air-progress`,
`air-metrics`, `air-metric`, `air-chart`, `air-util`, `air-checkpoints`, `air-exports`,
`air-failure`, `air-log-rank`, `air-logs`, `air-error`, `air-cancel`.

Example:
    >>> face = MonitorWidgets(on_cancel=job.cancel, on_metric=print, on_log_rank=print)  # doctest: +SKIP
    >>> face.apply(monitor_view(snapshot), cancel_clicked=False)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    import ipywidgets as widgets
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the AIR job monitor needs ipywidgets: pip install 'air-runtime[notebook]'"
    ) from exc

from air_sdk.notebook import snapshot_html
from air_sdk.notebook.monitor_view import MonitorView

__all__ = ["MonitorWidgets"]


class MonitorWidgets:
    """The widget tree of one monitor. `on_cancel` runs when the Cancel button is
    clicked; `on_metric` and `on_log_rank` when the user picks a metric or a rank's log
    (not when `apply` sets them)."""

    def __init__(
        self,
        *,
        on_cancel: Callable[[], None],
        on_metric: Callable[[str], None],
        on_log_rank: Callable[[int], None],
    ) -> None:
        layout = widgets.Layout
        self._syncing = False
        self.state = widgets.HTML(layout=layout(margin="0 12px 0 0"))
        self.cancel_button = widgets.Button(
            description="Cancel",
            button_style="danger",
            icon="stop",
            tooltip="Cancel this job: job.cancel()",
            layout=layout(width="auto"),
        )
        self.cancel_button.on_click(lambda _button: on_cancel())
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=layout(width="260px"))
        self.step = widgets.HTML(layout=layout(margin="0 0 0 8px"))
        self.metrics = widgets.HTML()
        self.metric_select = widgets.Dropdown(
            options=[], description="metric", layout=layout(width="280px")
        )
        self.metric_select.observe(self._picked(on_metric), names="value")
        self.chart = widgets.Image(
            value=b"", format="png", layout=layout(display="none", max_width="100%")
        )
        self.util = widgets.HTML()
        self.checkpoints = widgets.HTML()
        self.exports = widgets.HTML()
        self.failure = widgets.HTML(layout=layout(display="none"))
        self.log_rank_select = widgets.Dropdown(
            options=[], description="log of", layout=layout(width="200px", display="none")
        )
        self.log_rank_select.observe(self._picked(on_log_rank), names="value")
        self.logs = widgets.HTML()
        self.error = widgets.HTML(layout=layout(display="none"))
        header = widgets.HBox(
            [self.state, self.cancel_button],
            layout=layout(align_items="center", justify_content="space-between"),
        )
        progress_row = widgets.HBox([self.progress, self.step], layout=layout(align_items="center"))
        self.root = widgets.VBox(
            [
                header,
                progress_row,
                self.metrics,
                self.metric_select,
                self.chart,
                self.util,
                self.checkpoints,
                self.exports,
                self.failure,
                self.log_rank_select,
                self.logs,
                self.error,
            ],
            layout=layout(padding="4px"),
        )
        for widget, css_class in (
            (self.root, "air-monitor"),
            (self.state, "air-state"),
            (self.cancel_button, "air-cancel"),
            (self.progress, "air-progress"),
            (self.step, "air-step"),
            (self.metrics, "air-metrics"),
            (self.metric_select, "air-metric"),
            (self.chart, "air-chart"),
            (self.util, "air-util"),
            (self.checkpoints, "air-checkpoints"),
            (self.exports, "air-exports"),
            (self.failure, "air-failure"),
            (self.log_rank_select, "air-log-rank"),
            (self.logs, "air-logs"),
            (self.error, "air-error"),
        ):
            widget.add_class(css_class)
        self._all: list[widgets.Widget] = [
            self.root,
            header,
            progress_row,
            *header.children,
            *progress_row.children,
            *self.root.children[2:],
        ]

    def _picked(self, callback: Callable[[Any], None]) -> Callable[[dict[str, Any]], None]:
        def observer(change: dict[str, Any]) -> None:
            if not self._syncing and change["new"] is not None:
                callback(change["new"])

        return observer

    def apply(self, view: MonitorView, *, cancel_clicked: bool) -> None:
        """Show one redraw; the Cancel button stays disabled once clicked."""
        self.state.value = view.state_html
        self.step.value = view.step_html
        self.progress.max = view.progress_max
        self.progress.value = view.progress_value
        self.progress.bar_style = view.bar_style
        self.progress.layout.display = None if view.progress_shown else "none"
        self.metrics.value = view.metrics_html
        self._syncing = True
        try:
            if list(self.metric_select.options) != view.metric_options:
                self.metric_select.options = view.metric_options
            if view.metric is not None and self.metric_select.value != view.metric:
                self.metric_select.value = view.metric
            rank_options = [(f"rank {rank}", rank) for rank in view.log_ranks]
            if list(self.log_rank_select.options) != rank_options:
                self.log_rank_select.options = rank_options
            if view.log_rank is not None and self.log_rank_select.value != view.log_rank:
                self.log_rank_select.value = view.log_rank
        finally:
            self._syncing = False
        if view.chart_source is not None:
            self.chart.value = view.chart_png or b""
        self.chart.layout.display = None if view.chart_png else "none"
        self.util.value = view.util_html
        self.checkpoints.value = view.checkpoints_html
        self.exports.value = view.exports_html
        self.failure.value = view.failure_html
        self.failure.layout.display = None if view.failure_html else "none"
        self.log_rank_select.layout.display = None if view.log_ranks else "none"
        self.logs.value = view.logs_html
        self.show_error(view.error)
        if view.terminal:
            self.cancel_button.disabled = True
            self.cancel_button.description = "Cancel"
        else:
            self.cancel_button.disabled = cancel_clicked

    def show_error(self, message: str | None) -> None:
        """Show `message` in the error line (None: hide it)."""
        self.error.value = snapshot_html.error_html(message) if message else ""
        self.error.layout.display = None if message else "none"

    def cancelling(self, pending: bool) -> None:
        """The Cancel button while a cancel is under way (`pending`) or after it failed."""
        self.cancel_button.disabled = pending
        self.cancel_button.description = "Cancelling..." if pending else "Cancel"

    def close(self) -> None:
        for widget in self._all:
            widget.close()
