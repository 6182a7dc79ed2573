"""Sizing a value before it is pickled, and naming what travels with it.

A cell's values and a function's arguments are sized cheaply first, so a 2 GiB
tensor is refused without ever being copied: `survey` walks at most
`MAX_SIZED_OBJECTS` objects, `MAX_SIZING_DEPTH` deep, and adds up the arrays,
tensors, bytes and strings it meets (a lower bound). For a notebook (`__main__`)
function or class, which cloudpickle sends by value, it also names the globals
that travel with it, and the source files of its code (so a rank's traceback can
show the lines).

Example:
    >>> survey([b"x" * 1000, "abc"], "__main__").num_bytes
    1003
    >>> human_bytes(3 << 20)
    '3 MiB'
"""

from __future__ import annotations

import dis
import itertools
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_SIZED_OBJECTS",
    "MAX_SIZING_DEPTH",
    "Survey",
    "global_names",
    "human_bytes",
    "kind_of",
    "listed",
    "survey",
    "type_name",
]

MAX_SIZED_OBJECTS = 10_000
MAX_SIZING_DEPTH = 6
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"})


@dataclass
class Survey:
    """What `survey` found in one value."""

    num_bytes: int = 0
    """A lower bound of the bytes it pickles to."""
    uses: list[str] = field(default_factory=list)
    """Globals of the notebook a notebook function or class takes with it (not modules)."""
    source_files: set[str] = field(default_factory=set)
    """`co_filename` of every notebook function met (their lines can travel too)."""


def survey(value: Any, main_name: str) -> Survey:
    """Size `value` without pickling it (never copying arrays or tensors).

    Example:
        >>> ns = {"__name__": "__main__"}
        >>> exec("table = b'x' * 64\\ndef f():\\n    return table", ns)
        >>> found = survey(ns["f"], "__main__")
        >>> found.num_bytes, found.uses
        (64, ['table'])
    """
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    found = Survey(uses=global_names(value, main_name))
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    for _ in range(MAX_SIZED_OBJECTS):
        if not stack:
            break
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if torch is not None and isinstance(obj, torch.Tensor):
            found.num_bytes += _tensor_nbytes(obj)
        elif numpy is not None and isinstance(obj, numpy.ndarray):
            found.num_bytes += int(obj.nbytes)
        elif isinstance(obj, str | bytes | bytearray):
            found.num_bytes += len(obj)
        else:
            if isinstance(obj, types.FunctionType) and obj.__module__ == main_name:
                found.source_files.add(obj.__code__.co_filename)
            if depth < MAX_SIZING_DEPTH:
                stack.extend((child, depth + 1) for child in _children(obj, main_name, torch))
    return found


def _tensor_nbytes(tensor: Any) -> int:
    try:  # a view pickles its whole storage
        return int(tensor.untyped_storage().nbytes())
    except Exception:  # sparse, nested and other storage-less tensors
        return int(tensor.element_size() * tensor.nelement())


def _children(obj: Any, main_name: str, torch: Any) -> Iterator[Any]:
    cap = MAX_SIZED_OBJECTS
    if isinstance(obj, dict):
        yield from itertools.islice(obj.values(), cap)
    elif isinstance(obj, list | tuple | set | frozenset):
        yield from itertools.islice(obj, cap)
    elif torch is not None and isinstance(obj, torch.nn.Module):
        yield from itertools.chain(obj.parameters(), obj.buffers())
        yield from (
            v for k, v in vars(obj).items() if k not in ("_parameters", "_buffers", "_modules")
        )
    elif isinstance(obj, types.FunctionType):
        if obj.__module__ == main_name:  # pickled by value, with the globals it uses
            yield from _function_globals(obj).values()
            yield from (cell.cell_contents for cell in obj.__closure__ or () if _cell_full(cell))
            yield from obj.__defaults__ or ()
    elif isinstance(obj, type):
        if obj.__module__ == main_name:
            yield from _class_members(obj)
    elif not isinstance(obj, types.ModuleType | types.BuiltinFunctionType):
        try:
            attrs = vars(obj)
        except TypeError:
            return
        yield from itertools.islice(attrs.values(), cap)


def _cell_full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _class_members(cls: type) -> Iterator[Any]:
    for member in vars(cls).values():
        if isinstance(member, staticmethod | classmethod):
            yield member.__func__
        elif isinstance(member, property):
            yield from (f for f in (member.fget, member.fset, member.fdel) if f is not None)
        else:
            yield member


def _code_globals(code: types.CodeType) -> set[str]:
    # The same opcodes cloudpickle looks at: `self.model` is not the global `model`.
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_globals(const)
    return names


def _function_globals(func: types.FunctionType) -> dict[str, Any]:
    return {n: func.__globals__[n] for n in _code_globals(func.__code__) if n in func.__globals__}


def global_names(value: Any, main_name: str) -> list[str]:
    """Notebook globals that travel with a notebook function or class (not modules).

    Example:
        >>> ns = {"__name__": "__main__", "lr": 0.1}
        >>> exec("import math\\ndef step(x):\\n    return math.exp(x) * lr", ns)
        >>> global_names(ns["step"], "__main__")
        ['lr']
    """
    if isinstance(value, types.FunctionType) and value.__module__ == main_name:
        functions: Iterable[Any] = [value]
    elif isinstance(value, type) and value.__module__ == main_name:
        functions = [m for m in _class_members(value) if isinstance(m, types.FunctionType)]
    else:
        return []
    names: set[str] = set()
    for func in functions:
        names.update(
            n for n, v in _function_globals(func).items() if not isinstance(v, types.ModuleType)
        )
    return sorted(names)


def type_name(value: Any) -> str:
    """The class of `value` as messages name it: builtins and notebook classes bare.

    Example:
        >>> type_name(3), type_name(__import__("fractions").Fraction(1, 3))
        ('int', 'fractions.Fraction')
    """
    cls = type(value)
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


def kind_of(value: Any) -> str:
    """What `value` is, in the words of a size message: tensor, array, model (Linear).

    Example:
        >>> kind_of([1, 2])
        'list'
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return "tensor"
        if isinstance(value, torch.nn.Module):
            return f"model ({type(value).__qualname__})"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "array"
    return type_name(value)


def listed(names: Sequence[str]) -> str:
    """Names in backticks, comma separated.

    Example:
        >>> listed(["lock", "conn"])
        '`lock`, `conn`'
    """
    return ", ".join(f"`{n}`" for n in names)


def human_bytes(num_bytes: int) -> str:
    """A byte count for people: whole KiB/MiB/GiB where exact, one decimal otherwise.

    Example:
        >>> human_bytes(512), human_bytes(4096), human_bytes(1536)
        ('512 bytes', '4 KiB', '1.5 KiB')
    """
    value = float(num_bytes)
    unit = "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "bytes":
        return f"{num_bytes:,} bytes"
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
