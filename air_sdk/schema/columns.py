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
`metrics` event's data with the columns as they came: the msgpack bytes of the report
itself, not encoded again (`stored`; writing 500 numbers as JSON text was a tenth of a
report's CPU, and the text half as long again). The store hands every reader (metrics
page, event stream and API, exports, snapshot) the points as a `MetricsBatch` writes
them (`stored_data`, when an event is read), so none of them changed.
Values keep NaN and the infinities (a diverging loss is worth seeing), read back as
strings as everywhere (`air_sdk.schema.numbers`).

Example:
    >>> cols = to_columns([(1, 10.0, {"loss": 0.5}), (2, 11.0, {"loss": 0.25, "lr": 0.1})])
    >>> cols
    {'names': ['loss', 'lr'], 'step': [1, 2], 'ts': [10.0, 11.0], 'values': [[0.5, 0.25], [None, 0.1]]}
    >>> checked = PointColumns.check(cols)
    >>> checked.num_points, checked.last_step
    (2, 2)
    >>> stored = checked.stored(dropped_points=0, data_json="null").data
    >>> stored_data(stored)["points"][1]
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

import msgpack

from air_sdk.schema.events import MAX_POINTS_PER_REPORT
from air_sdk.schema.numbers import loads_data

__all__ = [
    "COLUMNS_KEY",
    "PointColumns",
    "SerializedMetrics",
    "points_form",
    "stored_data",
    "to_columns",
]

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
    """A `metrics` event's data already written, its points as columns
    (`PointColumns.stored`): the store appends it as it is, and reads it back with
    `stored_data`."""

    data: bytes


@dataclass(frozen=True, slots=True)
class PointColumns:
    """A checked batch of columns (`check` refuses a malformed one with a ValueError
    that says what to change)."""

    names: list[str]
    steps: list[int]
    ts: list[float]
    values: list[list[float | None]]
    #: the msgpack bytes these columns were decoded from, when they came so
    raw: bytes | None = None

    @property
    def num_points(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    @classmethod
    def check(cls, columns: object, *, raw: bytes | None = None) -> PointColumns:
        """The batch's shape checked as a whole: a mapping of exactly the four keys,
        lists of equal length within `MAX_POINTS_PER_REPORT`, unique string names, int
        steps within 64 bits, finite numeric times, and number-or-None values. `raw`:
        the msgpack bytes `columns` was decoded from, kept to be stored as they are."""
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
        return cls(names, steps, ts, values, raw)

    def stored(self, *, dropped_points: int, data_json: str) -> SerializedMetrics:
        """The `metrics` event's data as the store keeps it: a msgpack map of the columns
        as they came (`raw`, else encoded once here), `dropped_points` and `data_json`
        (the `DataLoading`'s JSON, or "null"). `stored_data` reads it back as what a
        `MetricsBatch` of these points writes."""
        raw = self.raw
        if raw is None:
            raw = msgpack.packb(
                {"names": self.names, "step": self.steps, "ts": self.ts, "values": self.values}
            )
        return SerializedMetrics(
            b"".join(
                (
                    _STORED_HEAD,
                    raw,
                    _DROPPED_KEY,
                    msgpack.packb(int(dropped_points)),
                    _DATA_KEY,
                    msgpack.packb(data_json),
                )
            )
        )


#: the stored form's map header (3 entries) and keys, written once
_STORED_HEAD = b"\x83" + msgpack.packb(COLUMNS_KEY)
_DROPPED_KEY = msgpack.packb("dropped_points")
_DATA_KEY = msgpack.packb("data")
#: NaN and the infinities as the wire writes them (`air_sdk.schema.numbers`)
_NON_FINITE_TEXT = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def stored_data(stored: bytes) -> dict[str, Any]:
    """A stored `metrics` event's data (`PointColumns.stored`) with its points as a
    `MetricsBatch` writes them: NaN and the infinities as their strings, a value a
    point lacks left out.

    Example:
        >>> cols = PointColumns.check({"names": ["loss"], "step": [1, 2], "ts": [1.0, 2.0],
        ...     "values": [[0.5, float("nan")]]})
        >>> stored_data(cols.stored(dropped_points=3, data_json="null").data)
        {'points': [{'step': 1, 'ts': 1.0, 'values': {'loss': 0.5}}, {'step': 2, 'ts': 2.0, 'values': {'loss': 'NaN'}}], 'dropped_points': 3, 'data': None}
    """
    data = msgpack.unpackb(stored, raw=False, strict_map_key=True)
    columns = data[COLUMNS_KEY]
    columns["values"] = [
        column
        if all(v is None or math.isfinite(v) for v in column)
        else [v if v is None or math.isfinite(v) else _NON_FINITE_TEXT[repr(v)] for v in column]
        for column in columns["values"]
    ]
    return points_form(
        {
            COLUMNS_KEY: columns,
            "dropped_points": data["dropped_points"],
            "data": loads_data(data["data"]),
        }
    )


def points_form(data: dict[str, Any]) -> dict[str, Any]:
    """A `metrics` event's data with its points as a `MetricsBatch` writes them
    (`{"points": [{"step", "ts", "values"}], ...}`): a columnar one rebuilt, a value a
    point lacks (None) left out; any other returned as it is. For `stored_data`, and
    for the columns the gateways of schema version 9 stored as JSON text.

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
