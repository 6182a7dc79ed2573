"""How NaN and the infinities cross the wire: as the strings "NaN", "Infinity" and
"-Infinity".

A diverging loss is worth seeing, so a metric value of `float("nan")` or `inf` is kept,
not dropped. Standard JSON has no such numbers: written as the bare constants Python
prints (`NaN`), a browser's or jq's parser refuses the page, and FastAPI writes them as
`null` inside an event's free-form `data`, which no float field takes back. So every
wire model serializes them as strings (pydantic's `ser_json_inf_nan="strings"`), the
float fields read those strings back as floats, and an event's `data` holds the
strings. Readers still accept the bare constants (older workers post them; older
stored rows hold them).

Example:
    >>> json_data(_Point(value=float("-inf")))
    {'value': '-Infinity'}
    >>> loads_data('{"loss": NaN}')
    {'loss': 'NaN'}
    >>> _Point.model_validate({"value": "NaN"}).value
    nan
"""

from __future__ import annotations

import json
import math
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["NON_FINITE", "format_value", "loads_data", "json_data"]

#: the `ser_json_inf_nan` mode of every wire model
NON_FINITE: Final[Literal["strings"]] = "strings"


class _Point(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan=NON_FINITE)

    value: float


def json_data(model: BaseModel) -> dict[str, Any]:
    """`model` as the JSON object an event's `data` holds: plain JSON types, with NaN
    and the infinities as strings (`model_dump(mode="json")` keeps them as floats)."""
    data: dict[str, Any] = json.loads(model.model_dump_json())
    return data


def loads_data(text: str | bytes) -> dict[str, Any]:
    """A stored event's `data` from its JSON, a bare `NaN`/`Infinity`/`-Infinity` of an
    older row read as the string of the same name (the wire form).

    Example:
        >>> loads_data('{"v": [Infinity, -Infinity, 1.5]}')
        {'v': ['Infinity', '-Infinity', 1.5]}
    """
    data: dict[str, Any] = json.loads(text, parse_constant=str)
    return data


def format_value(value: float, spec: str = ".4g") -> str:
    """A metric value for people: `spec` for a finite one, "nan", "inf" or "-inf" else.

    Example:
        >>> format_value(2.0 / 3), format_value(float("nan")), format_value(float("-inf"))
        ('0.6667', 'nan', '-inf')
    """
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)
