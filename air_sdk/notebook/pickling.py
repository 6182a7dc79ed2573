"""Pickling what a cell or a function takes to the workers: the payload's format.

The payload is a header, then one pickle per value through one cloudpickle
pickler (objects shared between values are pickled once):

- the notebook's own (`__main__`) functions and classes travel by value,
  anything imported from an installed module by reference (the worker imports
  it again); a module becomes an import line instead (`import_line`);
- the notebook's globals dict is pickled as a persistent id, so on the worker
  the functions of the notebook share the rank's `__main__` globals, as they
  shared the notebook's;
- each value is sized first (`air_sdk.notebook.sizing`) and the pickler's file
  refuses to grow past `max_value_bytes` per value, so a value that is too large
  is named, with what to do instead, before anything is copied or uploaded;
- a payload holding the value of a secret-looking environment variable is refused;
- the header carries the lines of the source files of the notebook functions
  that travel, so a rank's traceback shows them.

`air_sdk.notebook.bootstrap` is the other side: the code that loads this format
on every rank. `FORMAT_VERSION` changes when the two stop matching.

Example:
    >>> ns = {"__name__": "__main__", "lr": 0.1}
    >>> payload = pickle_values([Value("lr", ns["lr"])], ns)
    >>> import io, pickle
    >>> file = io.BytesIO(payload)
    >>> pickle.load(file)["names"], pickle.load(file)
    (['lr'], 0.1)
"""

from __future__ import annotations

import linecache
import os
import sys
import types
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from air_sdk.errors import CellCaptureError
from air_sdk.notebook.sizing import global_names, human_bytes, kind_of, listed, survey, type_name
from air_sdk.redact import is_secret_name

__all__ = [
    "CELL_WORDING",
    "DEFAULT_MAX_VALUE_BYTES",
    "FORMAT_VERSION",
    "MAIN_GLOBALS_ID",
    "Value",
    "Wording",
    "import_line",
    "pickle_values",
]

#: the largest value (after pickling) that may travel with a cell or a call
DEFAULT_MAX_VALUE_BYTES = 64 << 20
#: the payload format; the bootstrap refuses another
FORMAT_VERSION = 2
#: the persistent id that stands for the notebook's globals (the rank's `__main__` on load)
MAIN_GLOBALS_ID = "__main__"

_PICKLE_PROTOCOL = 5
_MIN_SECRET_CHARS = 6
# Source lines that travel for tracebacks: never more than this, all files together.
_MAX_SOURCE_CHARS = 1 << 20


@dataclass(frozen=True)
class Wording:
    """How refusals name where code runs and how to pass files and secrets, so the
    messages read right for a cell (`CELL_WORDING`) and for a function call.

    Example:
        >>> Wording(inside="the function", origin="`__main__`").inside
        'the function'
    """

    inside: str = "the cell"
    """Where to create what cannot travel ("create it inside the cell")."""
    origin: str = "the notebook"
    """Where the globals of a function come from ("it uses `lock` from the notebook")."""
    files: str = "pass that with --files"
    """How to send a file instead of a large value."""
    env: str = "pass it with --env {key}=..."
    """How to give the workers a secret (`{key}`: the variable's name)."""
    environment: str = "the notebook's environment"
    """Where a secret value came from."""
    subject: str = "a cell"
    """What secrets never travel with."""


CELL_WORDING = Wording()


@dataclass(frozen=True)
class Value:
    """One value to send: the global `name` it is bound to on the worker, and how
    messages call it (`label`, by default the name in backticks).

    Example:
        >>> Value("lr", 0.1).label, Value("_air_args", (), "the arguments").label
        ('`lr`', 'the arguments')
    """

    name: str
    value: Any
    label_text: str | None = None

    @property
    def label(self) -> str:
        return self.label_text or f"`{self.name}`"


def import_line(name: str, value: Any, wording: Wording = CELL_WORDING) -> str | None:
    """The import that rebinds `name` on a worker, or None for a value to pickle.

    Raises:
        CellCaptureError: a module that cannot be imported again by its name.

    Example:
        >>> import os.path
        >>> import_line("osp", os.path), import_line("lr", 0.1)
        ('import posixpath as osp', None)
    """
    if value is os.environ:
        return "from os import environ" + ("" if name == "environ" else f" as {name}")
    if not isinstance(value, types.ModuleType):
        return None
    module = value.__name__
    if module == "__main__" or sys.modules.get(module) is not value:
        raise CellCaptureError(
            f"`{name}` is a module that cannot be imported again by name ({module!r}):"
            f" import it inside {wording.inside}"
        )
    parent, _, leaf = module.rpartition(".")
    if name == module:
        return f"import {module}"
    if parent and name == leaf:
        return f"from {parent} import {leaf}"
    return f"import {module} as {name}"


class _ValueTooLarge(Exception):
    pass


class _BoundedBuffer:
    """A write-only file that refuses to grow more than `limit` bytes past `mark()`."""

    def __init__(self, limit: int) -> None:
        self.data = bytearray()
        self.limit = limit
        self.start = 0

    def mark(self) -> int:
        self.start = len(self.data)
        return self.start

    def write(self, chunk: bytes | memoryview) -> int:
        size = memoryview(chunk).nbytes
        if len(self.data) + size - self.start > self.limit:
            raise _ValueTooLarge
        self.data += chunk
        return size


_cloudpickle_code_reduce = getattr(cloudpickle.cloudpickle, "_code_reduce", None)


def _code_reduce_keeping_filename(code: types.CodeType) -> Any:
    """cloudpickle's reducer of code objects, but with the code's own file name, which
    cloudpickle replaces by "<dynamic-code>" (for deterministic pickles): a rank's
    traceback then names the notebook cell or script, and shows its lines."""
    assert _cloudpickle_code_reduce is not None
    make, args = _cloudpickle_code_reduce(code)
    return make, tuple(
        code.co_filename if isinstance(arg, str) and arg == "<dynamic-code>" else arg
        for arg in args
    )


class _CellPickler(cloudpickle.Pickler):
    """cloudpickle, except that the notebook's globals become the rank's `__main__`
    globals on load (a persistent id), so functions see what the cell binds, and that
    code keeps its file name."""

    if _cloudpickle_code_reduce is not None:
        dispatch_table = ChainMap(
            {types.CodeType: _code_reduce_keeping_filename}, cloudpickle.Pickler.dispatch_table
        )

    def __init__(self, file: _BoundedBuffer, namespace: Mapping[str, Any]) -> None:
        super().__init__(file, protocol=_PICKLE_PROTOCOL)
        self._main_globals: dict[str, Any] = {}
        globals_ref = getattr(self, "globals_ref", None)
        if isinstance(globals_ref, dict):  # cloudpickle's map: id(func.__globals__) -> dict
            globals_ref[id(namespace)] = self._main_globals

    def persistent_id(self, obj: Any) -> str | None:
        return MAIN_GLOBALS_ID if obj is self._main_globals else None


def pickle_values(
    values: Sequence[Value],
    namespace: Mapping[str, Any],
    *,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    wording: Wording = CELL_WORDING,
) -> bytes:
    """The payload for `values`, whose notebook functions have `namespace` as globals.

    Raises:
        CellCaptureError: a value cannot be pickled, pickles to more than
            `max_value_bytes`, or holds a secret from this process's environment.

    Example:
        >>> import threading
        >>> pickle_values([Value("lock", threading.Lock())], {})
        Traceback (most recent call last):
        ...
        air_sdk.errors.CellCaptureError: `lock` (_thread.lock) cannot be sent to the workers: create it inside the cell
    """
    main_name = namespace.get("__name__", "__main__")
    surveys = []
    for item in values:
        found = survey(item.value, main_name)
        if found.num_bytes > max_value_bytes:
            raise CellCaptureError(
                _too_large(item, found.num_bytes, max_value_bytes, found.uses, wording)
            )
        surveys.append(found)
    source_files = set().union(*(found.source_files for found in surveys))
    buffer = _BoundedBuffer(max(max_value_bytes, 1 << 20) + _MAX_SOURCE_CHARS * 4)
    pickler = _CellPickler(buffer, namespace)
    pickler.dump(
        {
            "format": FORMAT_VERSION,
            "names": [item.name for item in values],
            "labels": [item.label for item in values],
            "sources": _sources(source_files),
        }
    )
    # A secret typed into a notebook function's source would ride in the header.
    spans = [("the source lines of the notebook's functions", 0, len(buffer.data))]
    for item in values:
        buffer.limit = max_value_bytes
        start = buffer.mark()
        try:
            pickler.dump(item.value)
        except _ValueTooLarge:
            uses = global_names(item.value, main_name)
            raise CellCaptureError(_too_large(item, None, max_value_bytes, uses, wording)) from None
        except Exception as exc:
            raise CellCaptureError(_cannot_send(item, exc, main_name, wording)) from exc
        spans.append((item.label, start, len(buffer.data)))
    payload = bytes(buffer.data)
    _refuse_secrets(payload, spans, wording)
    return payload


def _sources(files: set[str]) -> dict[str, str]:
    """The lines of notebook code files the workers cannot read themselves: IPython's
    cells (in linecache only) and the caller's own script."""
    sources: dict[str, str] = {}
    budget = _MAX_SOURCE_CHARS
    for filename in sorted(files):
        text = "".join(linecache.getlines(filename))
        if text and len(text) <= budget:
            sources[filename] = text
            budget -= len(text)
    return sources


# -- refusals, in words that say what to do ------------------------------------------------


def _cannot_send(item: Value, exc: Exception, main_name: str, wording: Wording) -> str:
    kind = type_name(item.value)
    reason = str(exc).strip() or type(exc).__name__
    uses = global_names(item.value, main_name)
    if uses:
        return (
            f"{item.label} ({kind}) cannot be sent to the workers ({reason}): it uses"
            f" {listed(uses)} from {wording.origin}; create what cannot travel inside"
            f" {wording.inside}"
        )
    detail = "" if kind in reason else f" ({reason})"
    return (
        f"{item.label} ({kind}) cannot be sent to the workers{detail}: create it inside"
        f" {wording.inside}"
    )


def _too_large(
    item: Value, size: int | None, limit: int, uses: Sequence[str], wording: Wording
) -> str:
    limit_text = human_bytes(limit)
    advice = (
        f"load it inside {wording.inside} (torch.load / a dataset path) or save it to a"
        f" file and {wording.files}"
    )
    if uses:
        carried = (
            f"carries {human_bytes(size)}" if size is not None else f"pickles to over {limit_text}"
        )
        return (
            f"{item.label} ({type_name(item.value)}) {carried} through {listed(uses)} from"
            f" {wording.origin}; the limit is {limit_text}: {advice}"
        )
    if size is None:
        return (
            f"{item.label} ({type_name(item.value)}) pickles to over {limit_text}; the limit is"
            f" {limit_text}: {advice}"
        )
    return (
        f"{item.label} is a {human_bytes(size)} {kind_of(item.value)}; the limit is"
        f" {limit_text}: {advice}"
    )


def _refuse_secrets(
    payload: bytes, spans: Sequence[tuple[str, int, int]], wording: Wording
) -> None:
    for key, secret in os.environ.items():
        # Which names hold secrets is decided in one place, air_sdk.redact.
        if len(secret) < _MIN_SECRET_CHARS or not is_secret_name(key):
            continue
        at = payload.find(secret.encode("utf-8", "surrogateescape"))
        if at < 0:
            continue
        label = next((label for label, start, end in spans if start <= at < end), "a value")
        raise CellCaptureError(
            f"{label} holds the value of ${key} from {wording.environment}, and secrets do"
            f" not travel with {wording.subject}: {wording.env.format(key=key)} and read"
            f" os.environ[{key!r}] inside {wording.inside}"
        )
