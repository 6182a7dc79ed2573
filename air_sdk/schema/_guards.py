"""What a request body may cost to validate: bounded error counts.

pydantic lists one error per unknown key, per bad item of a list and per bad entry of a
dict, and turning them into Python objects costs about 8 us each: the issue-14 probe's
8 MB body of 700k unknown keys made 700k errors and a 28 MB answer, and took 17 s. So
a model on the wire refuses unknown keys with one error (`WireModel`), a dict is
measured before its entries are validated (`bounded_mapping`), and lists carry a
`max_length` (pydantic stops at the first item past it).

Example:
    >>> class Knob(WireModel):
    ...     size: int = 1
    >>> try:
    ...     Knob.model_validate(dict.fromkeys(["sise", "colour", "a", "b", "c", "d"], 1))
    ... except ValueError as exc:
    ...     print(exc.errors()[0]["msg"])
    Value error, unknown fields 'sise', 'colour', 'a', 'b', 'c' and 1 more: the fields are size
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["MAX_NAMED", "WireModel", "bounded_mapping", "refuse_unknown_fields"]

#: unknown keys pydantic may list one by one; past this, one error names this many
MAX_NAMED = 5
_FIELD_LIST_CHARS = 300


def refuse_unknown_fields(model: type[BaseModel], data: Any) -> Any:
    """`data` unchanged (a few unknown keys are left for pydantic to name, each at its
    place), or one ValueError naming the first of many.

    Example:
        >>> refuse_unknown_fields(WireModel, {"x": 1})
        {'x': 1}
        >>> refuse_unknown_fields(WireModel, dict.fromkeys("abcdefg", 1))
        Traceback (most recent call last):
        ...
        ValueError: unknown fields 'a', 'b', 'c', 'd', 'e' and 2 more: this object takes no fields
    """
    if not isinstance(data, Mapping):
        return data
    known = model.model_fields
    if all(key in known for key in data):
        return data
    unknown = [k for k in data if k not in known]
    if len(unknown) <= MAX_NAMED:
        return data  # pydantic names each one where it is ("resources.gpus: Extra inputs ...")
    named = ", ".join(repr(str(k)[:40]) for k in islice(unknown, MAX_NAMED))
    more = f" and {len(unknown) - MAX_NAMED} more" if len(unknown) > MAX_NAMED else ""
    fields = ", ".join(known)
    if len(fields) > _FIELD_LIST_CHARS:
        fields = fields[:_FIELD_LIST_CHARS] + " ..."
    hint = f"the fields are {fields}" if known else "this object takes no fields"
    plural = "s" if len(unknown) > 1 else ""
    raise ValueError(f"unknown field{plural} {named}{more}: {hint}")


def bounded_mapping(what: str, value: Any, max_items: int) -> Any:
    """`value` unchanged, or a ValueError when it is a mapping of over `max_items`
    entries; for `field_validator(..., mode="before")`, so the entries are not each
    validated (and each refused) first.

    Example:
        >>> bounded_mapping("env", {"A": "1", "B": "2"}, 1)
        Traceback (most recent call last):
        ...
        ValueError: env has 2 entries; the limit is 1
    """
    if isinstance(value, Mapping) and len(value) > max_items:
        raise ValueError(f"{what} has {len(value)} entries; the limit is {max_items}")
    return value


class WireModel(BaseModel):
    """A body model on the wire: unknown keys are one error, not one per key.

    Example:
        >>> class Ping(WireModel):
        ...     n: int = 0
        >>> Ping.model_validate({"n": 2}).n
        2
    """

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any) -> Any:
        return refuse_unknown_fields(cls, data)
