"""The chart's axes as points arrive: they must not jump under the user's eyes."""

from __future__ import annotations

import math
import random

import pytest

from air_sdk.notebook.chart import chart_limits, render_chart_png
from air_sdk.notebook.monitor_view import monitor_view
from air_sdk.schema import JobSnapshot


def growing(values: list[float]) -> list[list[tuple[int, float]]]:
    """The series as the monitor sees it after each new point (steps 0, 1, 2, ...)."""
    return [list(enumerate(values[: n + 1])) for n in range(len(values))]


def noisy_loss(num_steps: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [
        2.5 * math.exp(-step / 60) + 0.2 + rng.uniform(-0.05, 0.05) for step in range(num_steps)
    ]


@pytest.mark.parametrize("total", [150, None])
def test_the_value_axis_only_widens_and_the_step_axis_holds_still(total):
    limits = [chart_limits(points, total) for points in growing(noisy_loss(150))]
    assert all(lim is not None for lim in limits)
    for before, after in zip(limits, limits[1:], strict=False):
        assert after.y[0] <= before.y[0] and after.y[1] >= before.y[1]  # type: ignore[union-attr]
        assert after.x[0] == before.x[0] and after.x[1] >= before.x[1]  # type: ignore[union-attr]
    x_ranges = {lim.x for lim in limits}  # type: ignore[union-attr]
    if total is not None:
        assert x_ranges == {(0, 150)}  # the run's length from the first point on
    else:
        # round numbers: 8 changes in 150 points, not 150
        assert sorted(hi for _, hi in x_ranges) == [1, 2, 5, 10, 20, 50, 100, 200]
        assert all(
            lim.x[1] >= points[-1][0]
            for lim, points in zip(limits, growing(noisy_loss(150)), strict=True)
        )  # type: ignore[union-attr]


def test_every_value_stays_inside_and_a_diverging_loss_goes_log_once():
    values = [10.0 / (step + 1) ** 2 for step in range(60)]  # spans 3.6 decades
    limits = [chart_limits(points) for points in growing(values)]
    for lim, points in zip(limits, growing(values), strict=True):
        assert lim is not None
        assert all(lim.y[0] <= v <= lim.y[1] for _, v in points)
    switched = [i for i in range(1, len(limits)) if limits[i].log != limits[i - 1].log]  # type: ignore[union-attr]
    assert len(switched) == 1 and limits[-1].log  # type: ignore[union-attr]


def test_non_finite_values_leave_the_value_axis_alone():
    assert chart_limits([(0, math.nan)]) is None
    lim = chart_limits([(0, 1.0), (1, math.inf), (2, 0.5)])
    assert lim is not None and math.isfinite(lim.y[1]) and lim.x == (0, 2)


def test_the_monitor_draws_against_the_runs_length():
    snapshot = JobSnapshot(job_id="j", step=9, series={"loss": list(enumerate(noisy_loss(10)))})
    view = monitor_view(snapshot, total_steps=150)
    assert view.chart_source is not None and view.chart_source.total_steps == 150
    assert render_chart_png(view.chart_source, "loss") is not None
