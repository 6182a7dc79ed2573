"""A report's metric points as columns: the compact form the runtime's shipper sends.

A `WorkerReport` posted as JSON lists its points one object each (`MetricPoint`). The
shipper's binary reports (msgpack, `Content-Type: application/msgpack`) carry them as
columns instead, under the key `columns`:

    {"names": ["loss", "lr"],             # the metric names, each once
     "step": [1, 2, 3],                   # one int per point
     "ts": [t1, t2, t3],                  # one finite number per point (unix seconds)
     "values": [[0.5, 0.4, NaN],          # one column per name, one entry per point:
                [0.1, None, 0.1]]}        #   a number, or None where that point lacks it

The gateway checks the batch's shape here (equal lengths, types, finite steps and
times, the per-report limit), never building a model per point, and stores the
`metrics` event's data with the columns as they came (`stored_json`: a third of the
bytes of a point per object, written in one call). The store hands every reader
(metrics page, event stream and API, exports, snapshot) the points as a `MetricsBatch`
writes them (`points_form`, when an event is read), so none of them changed.
Values keep NaN and the infinities (a diverging loss is worth seeing), written as
strings as everywhere (`air_sdk.schema.numbers`).

Example:
    >>> cols = to_columns([(1, 10.0, {"loss": 0.5}), (2, 11.0, {"loss": 0.25, "lr": 0.1})])
    >>> cols
    {'names': ['loss', 'lr'], 'step': [1, 2], 'ts': [10.0, 11.0], 'values': [[0.5, 0.25], [None, 0.1]]}
    >>> checked = PointColumns.check(cols)
    >>> checked.num_points, checked.last_step
    (2, 2)
    >>> import json
    >>> stored = checked.stored_json(dropped_points=0, data_json="null").data_json
    >>> stored[:60]
    '{"columns":{"names":["loss","lr"],"step":[1,2],"ts":[10.0,11'
    >>> points_form(json.loads(stored))["points"][1]
    {'step': 2, 'ts': 11.0, 'values': {'loss': 0.25, 'lr': 0.1}}
    >>> PointColumns.check({"names": ["loss"], "step": [1], "ts": [1.0], "values": [[1.0, 2.0]]})
    Traceback (most recent call last):
    ...
    ValueError: columns.values[0] ('loss') has 2 entries for 1 steps; give every column one entry per step (None where a point lacks the value)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from air_sdk.schema.events import MAX_POINTS_PER_REPORT
from air_sdk.schema.numbers import NON_FINITE

__all__ = ["COLUMNS_KEY", "PointColumns", "SerializedMetrics", "points_form", "to_columns"]

#: the key of a binary report that holds its points as columns
COLUMNS_KEY = "columns"
_KEYS = frozenset({"names", "step", "ts", "values"})
_INT64 = (-(1 << 63), (1 << 63) - 1)
_NUMBER = frozenset({float, int})
_VALUE = frozenset({float, int, type(None)})


def to_columns(points: Sequence[tuple[int, float, dict[str, float]]]) -> dict[str, Any]:
    """`(step, ts, values)` points as the columns of a binary report (names in the order
    they first appear).

    Example:
        >>> to_columns([])
        {'names': [], 'step': [], 'ts': [], 'values': []}
    """
    names: dict[str, None] = {}
    first = points[0][2].keys() if points else {}.keys()
    names.update(dict.fromkeys(first))
    if any(p[2].keys() != first for p in points):  # rare: points with different names
        for point in points:
            names.update(dict.fromkeys(point[2]))
    return {
        "names": list(names),
        "step": [p[0] for p in points],
        "ts": [p[1] for p in points],
        "values": [[p[2].get(name) for p in points] for name in names],
    }


@dataclass(frozen=True, slots=True)
class SerializedMetrics:
    """A `metrics` event's data already written as JSON, its points as columns
    (`PointColumns.stored_json`): the store appends it as it is."""

    data_json: str


@dataclass(frozen=True, slots=True)
class PointColumns:
    """A checked batch of columns (`check` refuses a malformed one with a ValueError
    that says what to change)."""

    names: list[str]
    steps: list[int]
    ts: list[float]
    values: list[list[float | None]]

    @property
    def num_points(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    @classmethod
    def check(cls, columns: object) -> PointColumns:
        """The batch's shape checked as a whole: a mapping of exactly the four keys,
        lists of equal length within `MAX_POINTS_PER_REPORT`, unique string names, int
        steps within 64 bits, finite numeric times, and number-or-None values."""
        if not isinstance(columns, dict) or set(columns) != _KEYS:
            got = sorted(map(str, columns)) if isinstance(columns, dict) else type(columns).__name__
            raise ValueError(f"columns must be a map of exactly {sorted(_KEYS)}, not {got}")
        names, steps, ts, values = (columns[k] for k in ("names", "step", "ts", "values"))
        for key, column in (("names", names), ("step", steps), ("ts", ts), ("values", values)):
            if not isinstance(column, list):
                raise ValueError(f"columns.{key} must be a list, not {type(column).__name__}")
        num = len(steps)
        if num > MAX_POINTS_PER_REPORT:
            raise ValueError(
                f"columns hold {num} points; a report takes at most {MAX_POINTS_PER_REPORT}:"
                " split them over several reports"
            )
        if set(map(type, names)) - {str}:
            raise ValueError("columns.names must all be strings")
        if len(set(names)) != len(names):
            raise ValueError("columns.names lists a name twice; give each metric one column")
        if len(ts) != num:
            raise ValueError(f"columns.ts has {len(ts)} entries for {num} steps; give one per step")
        if len(values) != len(names):
            raise ValueError(
                f"columns.values has {len(values)} columns for {len(names)} names;"
                " give one column per name"
            )
        if num:
            if set(map(type, steps)) - {int}:
                raise ValueError("columns.step must all be integers")
            if min(steps) < _INT64[0] or max(steps) > _INT64[1]:
                raise ValueError("columns.step holds a step outside 64-bit integers")
            if set(map(type, ts)) - _NUMBER:
                raise ValueError("columns.ts must all be numbers (unix seconds)")
            if not all(map(math.isfinite, ts)):
                raise ValueError("columns.ts holds NaN or an infinity; send the time of the point")
        for index, (name, column) in enumerate(zip(names, values, strict=True)):
            if not isinstance(column, list) or len(column) != num:
                size = len(column) if isinstance(column, list) else type(column).__name__
                raise ValueError(
                    f"columns.values[{index}] ({name!r}) has {size} entries for {num} steps;"
                    " give every column one entry per step (None where a point lacks the value)"
                )
            if set(map(type, column)) - _VALUE:
                raise ValueError(f"columns.values[{index}] ({name!r}) must hold numbers or None")
        return cls(names, steps, ts, values)

    def stored_json(self, *, dropped_points: int, data_json: str) -> SerializedMetrics:
        """The `metrics` event's data as the store keeps it: the columns as they came
        (one serializer call, no object per point), `dropped_points` and `data` (the
        `DataLoading`'s JSON, or "null"). `points_form` turns it back into what a
        `MetricsBatch` of these points writes, when the event is read."""
        columns = {"names": self.names, "step": self.steps, "ts": self.ts, "values": self.values}
        text = to_json(columns, inf_nan_mode=NON_FINITE).decode()
        return SerializedMetrics(
            f'{{"{COLUMNS_KEY}":{text},"dropped_points":{int(dropped_points)},"data":{data_json}}}'
        )


def points_form(data: dict[str, Any]) -> dict[str, Any]:
    """A stored `metrics` event's data with its points as a `MetricsBatch` writes them
    (`{"points": [{"step", "ts", "values"}], ...}`): a columnar one rebuilt, a value a
    point lacks (None) left out; any other returned as it is.

    Example:
        >>> points_form({"columns": {"names": ["loss", "lr"], "step": [1, 2], "ts": [1.0, 2.0],
        ...     "values": [[0.5, "NaN"], [None, 0.1]]}, "dropped_points": 0, "data": None})
        {'points': [{'step': 1, 'ts': 1.0, 'values': {'loss': 0.5}}, {'step': 2, 'ts': 2.0, 'values': {'loss': 'NaN', 'lr': 0.1}}], 'dropped_points': 0, 'data': None}
    """
    columns = data.get(COLUMNS_KEY)
    if not isinstance(columns, dict):
        return data
    names, values = columns["names"], columns["values"]
    if any(None in column for column in values):
        rows = [
            {n: v for n, v in zip(names, row, strict=True) if v is not None}
            for row in zip(*values, strict=True)
        ]
    else:
        rows = [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]
    if not values:
        rows = [{} for _ in columns["step"]]
    points = [
        {"step": s, "ts": t, "values": v}
        for s, t, v in zip(columns["step"], columns["ts"], rows, strict=True)
    ]
    rest = {k: v for k, v in data.items() if k != COLUMNS_KEY}
    return {"points": points, **rest}
