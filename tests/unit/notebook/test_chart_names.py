"""Metric names reach matplotlib as literal text, and NaN/inf points draw as gaps with
markers: whatever a job logs, its chart renders."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib", reason="the chart needs the notebook extra (matplotlib)")

from air_sdk.notebook.chart import PNG_MAGIC, render_chart_png  # noqa: E402
from air_sdk.schema import CheckpointCommit, JobSnapshot  # noqa: E402


def _snapshot(name: str, values: list[float]) -> JobSnapshot:
    commit = CheckpointCommit(
        step=1, path="/c/1", world_size=1, size_bytes=1, num_files=1, blocked_s=0, durable_s=0
    )
    return JobSnapshot(
        job_id="j",
        series={name: [(step, v) for step, v in enumerate(values, start=1)]},
        restarts_at_step=[2],
        checkpoints=[commit],  # a legend, so the name is drawn there too
    )


@pytest.mark.parametrize("name", ["$x_{$", "loss$\\foo$", "cost ($)", "a$b$c", "50%_{x}^"])
def test_metric_names_with_dollar_signs_render(name):
    png = render_chart_png(_snapshot(name, [3.0, 2.0, 1.0]), name)
    assert png is not None and png.startswith(PNG_MAGIC)


def test_non_finite_points_render_and_are_marked():
    values = [3.0, math.nan, math.inf, -math.inf, 1.0]
    png = render_chart_png(_snapshot("loss", values), "loss")
    assert png is not None and png.startswith(PNG_MAGIC)


def test_a_series_of_only_nan_still_renders():
    png = render_chart_png(_snapshot("loss", [math.nan, math.nan]), "loss")
    assert png is not None and png.startswith(PNG_MAGIC)
