"""Columnar points: the gateway stores them as columns, and what a reader gets back
(`points_form`) is what a MetricsBatch of the same points writes, for every kind of
value and name."""

from __future__ import annotations

import json
import math

import pytest

from air_sdk.schema.columns import COLUMNS_KEY, PointColumns, points_form, to_columns
from air_sdk.schema.events import MetricPoint, MetricsBatch
from air_sdk.schema.numbers import loads_data

NAMES = ["loss", "a%sb", 'q"uote', "ünï", "x,y", "%"]
VALUES = [0.5, math.nan, math.inf, -math.inf, 1e-300, 12345678901234567.0, 1 / 3, -0.0]


def _batch_json(points: list[tuple[int, float, dict[str, float]]], dropped: int = 0) -> dict:
    checked = PointColumns.check(to_columns(points))
    stored = loads_data(checked.stored_json(dropped_points=dropped, data_json="null").data_json)
    assert COLUMNS_KEY in stored and "points" not in stored  # kept as columns...
    return points_form(stored)  # ...read as points


def _model_json(points: list[tuple[int, float, dict[str, float]]], dropped: int = 0) -> dict:
    batch = MetricsBatch(
        points=[MetricPoint(step=s, ts=t, values=v) for s, t, v in points], dropped_points=dropped
    )
    return json.loads(batch.model_dump_json())


@pytest.mark.parametrize("num_names", range(len(NAMES) + 1))
def test_every_point_with_every_name_is_stored_as_the_model_writes_it(num_names: int) -> None:
    names = NAMES[:num_names]
    points = [
        (step, 1.7e9 + step / 7, {n: VALUES[(step + i) % len(VALUES)] for i, n in enumerate(names)})
        for step in range(-3, 40)
    ]
    assert _batch_json(points, dropped=4) == _model_json(points, dropped=4)


def test_points_with_different_names_are_stored_as_the_model_writes_them() -> None:
    points = [(1, 1.0, {"loss": math.nan}), (2, 2.0, {"lr": 0.1}), (3, 3.0, {})]
    assert _batch_json(points) == _model_json(points)
    assert _batch_json([]) == _model_json([])


def test_non_finite_values_are_written_as_the_wire_strings() -> None:
    stored = _batch_json([(1, 1.0, {"a": math.nan, "b": math.inf, "c": -math.inf})])
    assert stored["points"][0]["values"] == {"a": "NaN", "b": "Infinity", "c": "-Infinity"}
