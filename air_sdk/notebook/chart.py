"""One metric of a JobSnapshot as a PNG line chart, with restart and checkpoint markers.

matplotlib's object API on the Agg canvas only: pyplot keeps a global figure
registry that is not thread safe and leaks figures, and the monitor draws from
a background thread.

Example:
    >>> png = render_chart_png(snapshot, "loss")  # doctest: +SKIP
    >>> png[:8] == PNG_MAGIC  # doctest: +SKIP
    True
"""

from __future__ import annotations

import io
import math
from typing import Any

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the AIR chart needs matplotlib: pip install 'air-runtime[notebook]'"
    ) from exc

from air_sdk.schema.snapshot import JobSnapshot

__all__ = ["PNG_MAGIC", "render_chart_png"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_DPI = 100
_LINE = "#2563eb"
_RESTART = "#d97706"
_CHECKPOINT = "#15803d"
_NON_FINITE = "#dc2626"
_MARGIN_LEFT_PX, _MARGIN_RIGHT_PX, _MARGIN_BOTTOM_PX, _MARGIN_TOP_PX = 62, 12, 38, 10


def render_chart_png(
    snapshot: JobSnapshot, metric: str, *, width_px: int = 640, height_px: int = 240
) -> bytes | None:
    """`metric` against step as PNG bytes; None when the metric has no points.

    Restarts (`snapshot.restarts_at_step`) are vertical dashed lines; committed
    checkpoints (`snapshot.checkpoints`) are small triangles
    on the step axis. NaN and infinite values are gaps in the line with a red cross
    at the top of their step. A loss spanning more than two decades gets a log scale.
    The metric's name is drawn literally (a "$" in it is a dollar sign, not mathtext).

    Example:
        >>> render_chart_png(JobSnapshot(job_id="j"), "loss") is None
        True
    """
    points = snapshot.series.get(metric) or []
    if not points:
        return None
    if width_px < 50 or height_px < 50:
        raise ValueError(f"a chart of {width_px}x{height_px} px is too small; use at least 50x50")
    steps = [step for step, _ in points]
    # Infinities would wreck the autoscaling: draw them as gaps, like NaN, and mark
    # their steps (a diverging loss is what a person must not miss).
    values = [value if math.isfinite(value) else math.nan for _, value in points]
    non_finite_steps = [step for step, value in points if not math.isfinite(value)]

    figure = Figure(figsize=(width_px / _DPI, height_px / _DPI), dpi=_DPI)
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot(steps, values, color=_LINE, linewidth=1.4, label=metric)
    if len(points) == 1:
        axes.plot(steps, values, "o", color=_LINE, markersize=4)
    if non_finite_steps:  # at the top
        _step_marks(axes, non_finite_steps, 0.97, "x", _NON_FINITE, "nan/inf")

    finite = [v for v in values if not math.isnan(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 100:
        axes.set_yscale("log")

    for i, step in enumerate(snapshot.restarts_at_step):
        axes.axvline(
            step,
            color=_RESTART,
            linestyle="--",
            linewidth=1.0,
            label="restart" if i == 0 else None,
        )
    checkpoint_steps = [ck.step for ck in snapshot.checkpoints]
    if checkpoint_steps:  # on the step axis
        _step_marks(axes, checkpoint_steps, 0.03, "^", _CHECKPOINT, "checkpoint")

    # Few ticks, no minor ones on a linear axis: every tick is a handful of artists.
    axes.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    if axes.get_yscale() == "linear":
        axes.yaxis.set_major_locator(MaxNLocator(nbins=5))
        axes.minorticks_off()
    axes.set_xlabel("step", fontsize=9)
    # A metric's name is drawn as typed: "$" would start matplotlib's mathtext.
    axes.set_ylabel(metric, fontsize=9, parse_math=False)
    axes.tick_params(labelsize=8)
    axes.grid(True, alpha=0.3)
    if snapshot.restarts_at_step or checkpoint_steps or non_finite_steps:
        # A fixed corner: loc="best" scans every point of every line (slow).
        legend = axes.legend(fontsize=8, loc="upper right", frameon=False)
        for text in legend.get_texts():
            text.set_parse_math(False)  # the metric's name, as typed
    # Fixed margins in pixels: tight_layout measures every tick label and costs
    # ~0.5 s a chart (more than the rest of the drawing together).
    figure.subplots_adjust(
        left=_MARGIN_LEFT_PX / width_px,
        right=1 - _MARGIN_RIGHT_PX / width_px,
        bottom=_MARGIN_BOTTOM_PX / height_px,
        top=1 - _MARGIN_TOP_PX / height_px,
    )

    buffer = io.BytesIO()
    canvas.print_png(buffer)
    return buffer.getvalue()


def _step_marks(
    axes: Any, steps: list[int], height: float, marker: str, color: str, label: str
) -> None:
    """Markers at `steps`, at `height` of the axes (x in data coordinates, y in axes
    coordinates: they sit where they are whatever the metric's scale)."""
    axes.plot(
        steps,
        [height] * len(steps),
        marker,
        color=color,
        markersize=5,
        transform=axes.get_xaxis_transform(),
        clip_on=False,
        label=label,
        linestyle="none",
    )
