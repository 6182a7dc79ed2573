"""Columnar points: the gateway stores them as columns (the msgpack bytes they came in),
and what a reader gets back (`stored_data`) is what a MetricsBatch of the same points
writes, for every kind of value and name; so are the columns older gateways stored as
JSON text (`points_form`)."""

from __future__ import annotations

import json
import math

import msgpack
import pytest
from pydantic_core import to_json

from air_sdk.schema.columns import (
    COLUMNS_KEY,
    PointColumns,
    points_form,
    stored_data,
    to_columns,
)
from air_sdk.schema.events import MetricPoint, MetricsBatch
from air_sdk.schema.numbers import NON_FINITE, loads_data

NAMES = ["loss", "a%sb", 'q"uote', "ünï", "x,y", "%"]
VALUES = [0.5, math.nan, math.inf, -math.inf, 1e-300, 12345678901234567.0, 1 / 3, -0.0]


def _batch_json(points: list[tuple[int, float, dict[str, float]]], dropped: int = 0) -> dict:
    raw = msgpack.packb(to_columns(points))  # as the shipper sends them
    checked = PointColumns.check(msgpack.unpackb(raw), raw=raw)
    stored = checked.stored(dropped_points=dropped, data_json="null").data
    assert raw in stored  # kept as the bytes they came in...
    assert stored_data(stored) == _older_json(points, dropped)  # ...as older gateways read them
    return stored_data(stored)  # ...read as points


def _older_json(points: list[tuple[int, float, dict[str, float]]], dropped: int) -> dict:
    """The points as schema version 9 stored them (columns as JSON text), read back."""
    text = to_json(to_columns(points), inf_nan_mode=NON_FINITE).decode()
    stored = loads_data(f'{{"{COLUMNS_KEY}":{text},"dropped_points":{dropped},"data":null}}')
    return points_form(stored)


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


def test_columns_checked_without_their_bytes_are_encoded_once_and_read_the_same() -> None:
    points = [(1, 1.0, {"loss": 0.5, "lr": math.nan}), (2, 2.0, {"loss": 0.25})]
    checked = PointColumns.check(to_columns(points))
    data = stored_data(checked.stored(dropped_points=2, data_json='{"wait_s": 1.5}').data)
    assert data == {**_model_json(points, dropped=2), "data": {"wait_s": 1.5}}
