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
from dataclasses import dataclass
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

__all__ = ["PNG_MAGIC", "ChartLimits", "chart_limits", "render_chart_png"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_DPI = 100
_LINE = "#2563eb"
_RESTART = "#d97706"
_CHECKPOINT = "#15803d"
_NON_FINITE = "#dc2626"
_MARGIN_LEFT_PX, _MARGIN_RIGHT_PX, _MARGIN_BOTTOM_PX, _MARGIN_TOP_PX = 62, 12, 38, 10
#: room above and below the values, as a part of their span
_Y_PAD = 0.05
#: a loss spanning more than this factor is drawn on a log scale
_LOG_SPAN = 100


@dataclass(frozen=True)
class ChartLimits:
    """The axes of a chart: step range, value range and whether values are on a log scale."""

    x: tuple[float, float]
    y: tuple[float, float]
    log: bool


def chart_limits(
    points: list[tuple[int, float]], total_steps: int | None = None
) -> ChartLimits | None:
    """The axes for `points` (step, value), chosen so the chart does not jump as points
    arrive: the step axis runs from the first step to the run's length when it is known,
    else to the next round number (1, 2 or 5 x 10^k) past the last step, so it grows a
    few times in a run, not with every point; the value axis spans every finite value
    seen, with a margin of a twentieth of their span or largest magnitude: it only
    widens, smoothly, as a new extreme arrives. None without a finite value.

    Example:
        >>> chart_limits([(0, 2.0), (10, 1.0)], total_steps=150)
        ChartLimits(x=(0, 150), y=(0.9, 2.1), log=False)
        >>> chart_limits([(0, 2.0), (130, 1.0)]).x
        (0, 200)
    """
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    if not finite:
        return None
    steps = [s for s, _ in points]
    first, last = min(steps), max(steps)
    if total_steps is not None and total_steps > last:
        x_hi: float = total_steps
    else:
        x_hi = _round_up(last)
    if x_hi <= first:
        x_hi = first + 1
    low, high = min(v for _, v in finite), max(v for _, v in finite)
    log = low > 0 and high / low > _LOG_SPAN
    if log:  # the margin in decades, so it is the same on the screen
        pad = (math.log10(high) - math.log10(low)) * _Y_PAD
        y = (low / 10**pad, high * 10**pad)
    else:
        # Neither the span nor the largest magnitude ever shrinks as points arrive, so
        # neither does the margin: the limits only move outwards.
        pad = max(high - low, abs(low), abs(high)) * _Y_PAD or _Y_PAD
        y = (round(low - pad, 12), round(high + pad, 12))
    return ChartLimits(x=(first, x_hi), y=y, log=log)


def _round_up(step: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least `step`.

    Example:
        >>> [_round_up(n) for n in (0, 1, 3, 7, 149, 150, 201)]
        [1, 1, 5, 10, 200, 200, 500]
    """
    if step <= 1:
        return 1
    scale = 10 ** math.floor(math.log10(step))
    for factor in (1, 2, 5, 10):
        if factor * scale >= step:
            return factor * scale
    raise AssertionError("unreachable")


def render_chart_png(
    snapshot: JobSnapshot, metric: str, *, width_px: int = 640, height_px: int = 240
) -> bytes | None:
    """`metric` against step as PNG bytes; None when the metric has no points.

    Restarts (`snapshot.restarts_at_step`) are vertical dashed lines; committed
    checkpoints (`snapshot.checkpoints`) are small triangles
    on the step axis. NaN and infinite values are gaps in the line with a red cross
    at the top of their step. A loss spanning more than two decades gets a log scale.
    The axes are `chart_limits` of the points and `snapshot.total_steps`: they do not
    jump as points arrive.
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

    limits = chart_limits(points, snapshot.total_steps)
    if limits is not None:
        if limits.log:
            axes.set_yscale("log")
        axes.set_ylim(*limits.y)
        axes.set_xlim(*limits.x)

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
