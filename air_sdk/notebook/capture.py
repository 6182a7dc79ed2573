"""Packaging code to run on every rank of a job: a notebook cell, or a function call.

Both become the same thing, a `CellPackage`: the bootstrap every rank runs
(`JobSpec.code`) and one payload file of pickled values. For a cell, the source
is the program, and what it uses from earlier cells travels with it:

- names bound to modules are imported again on the workers
  (`import numpy as np`, `from torch import nn`);
- functions, classes and values are pickled with cloudpickle: the notebook's
  own (`__main__`) functions and classes by value, anything imported from an
  installed module by reference (the worker imports it again);
- nothing from `os.environ` travels (a name bound to `os.environ` is bound to
  the worker's own), and a pickle that holds the value of a secret-looking
  environment variable is refused.

For a call (`@air_sdk.distributed`), the function and its arguments are the
values, pickled the same way, and the program hands them to
`air_sdk.runtime.function_call.run_function` on every rank.

On the worker, the functions of the notebook share the rank's `__main__` globals
with the cell, as they shared the notebook's: a helper from an earlier cell sees
the `model` the train cell builds. Tracebacks show the cell's own line numbers
and lines (`File "<air cell>", line 7`), and those of the notebook's functions.

A value that cannot be pickled (a lock, a socket, a database connection, a
generator), or one over `max_value_bytes` (sized cheaply before pickling, so a
2 GiB tensor is never copied), raises `CellCaptureError` naming the variable
and what to do instead, before anything is uploaded.

The parts: `names` (which names a cell uses), `sizing` and `pickling` (the
payload), `bootstrap` (the program that loads it); files sent with `--files`
are read by `air_sdk.bundle.collect_files`.

Example:
    >>> ns = {"__name__": "__main__"}
    >>> exec("import math\\ndef area(r):\\n    return math.pi * r * r", ns)
    >>> package = package_cell("print(area(2.0))", ns)
    >>> package.captured, package.imports
    (['area'], [])
    >>> sorted(package.files)
    ['__air_cell__.pkl']
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from air_sdk.errors import CellCaptureError
from air_sdk.notebook.bootstrap import CALL_FILENAME, CELL_FILENAME, CELL_PICKLE, render_bootstrap
from air_sdk.notebook.names import free_names, is_shell_name
from air_sdk.notebook.pickling import (
    DEFAULT_MAX_VALUE_BYTES,
    Value,
    Wording,
    import_line,
    pickle_values,
)

__all__ = [
    "CALL_FILENAME",
    "CELL_FILENAME",
    "CELL_PICKLE",
    "DEFAULT_MAX_VALUE_BYTES",
    "CellCaptureError",
    "CellPackage",
    "free_names",
    "package_call",
    "package_cell",
]


@dataclass(frozen=True)
class CellPackage:
    """Code ready to submit: `JobSpec.code` plus the files to add to the bundle.

    Example:
        >>> package = package_cell("x = 1", {})
        >>> client.submit(job_spec(code=package.code), extra_files=package.files)  # doctest: +SKIP
    """

    code: str
    """The bootstrap every rank runs: loads `CELL_PICKLE`, imports, runs the program."""
    files: dict[str, bytes] = field(repr=False)
    """Bundle path -> bytes (the pickled values)."""
    captured: list[str]
    """Names pickled from the notebook, in the order the cell first uses them (for a
    call: the function's name, then `argument 1`..., `lr`... for keyword arguments)."""
    imports: list[str]
    """Import lines the workers run again, e.g. `import numpy as np`."""


class _Missing:
    pass


_MISSING = _Missing()


def package_cell(
    source: str,
    namespace: Mapping[str, Any],
    *,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
) -> CellPackage:
    """Package `source` with what it uses from `namespace` (the notebook's globals).

    Raises:
        CellCaptureError: the cell is not valid Python; a value it uses cannot be
            pickled, pickles to more than `max_value_bytes`, or holds a secret
            from the notebook's environment.

    Example:
        >>> ns = {"__name__": "__main__", "lr": 0.1}
        >>> package_cell("print(lr)", ns).captured
        ['lr']
    """
    imports: list[str] = []
    values: list[Value] = []
    for name in free_names(source):
        if is_shell_name(name) or name not in namespace:
            continue
        value = namespace[name]
        if value is getattr(builtins, name, _MISSING):
            continue
        line = import_line(name, value)
        if line is not None:
            imports.append(line)
        else:
            values.append(Value(name, value))
    payload = pickle_values(values, namespace, max_value_bytes=max_value_bytes)
    return CellPackage(
        code=render_bootstrap(source, imports),
        files={CELL_PICKLE: payload},
        captured=[v.name for v in values],
        imports=imports,
    )


def package_call(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
) -> CellPackage:
    """Package the call `fn(*args, **kwargs)`, to run on every rank of a job.

    Rank 0's return value comes back through the gateway (see
    `air_sdk.runtime.function_call`). `fn` and the arguments are pickled as a
    cell's values are: a function of the notebook or of the script (`__main__`) by
    value, with the globals it uses; one from an installed module by reference.

    Raises:
        CellCaptureError: `fn` is not callable, or it or an argument cannot be
            pickled, is over `max_value_bytes`, or holds a secret.

    Example:
        >>> import math
        >>> package = package_call(math.hypot, (3.0, 4.0))
        >>> package.captured
        ['hypot', 'argument 1', 'argument 2']
    """
    if not callable(fn):
        raise CellCaptureError(f"{fn!r} is not a function: pass the function to run on every rank")
    kwargs = dict(kwargs or {})
    namespace = _globals_of(fn)
    title = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    notebook = "get_ipython" in namespace or "In" in namespace
    wording = Wording(
        inside="the function",
        origin="the notebook" if notebook else f"`{namespace.get('__name__', '__main__')}`",
        files="pass its path (with files=[...] to send the file)",
        env="pass it with env={{{key!r}: ...}}",
        environment="the notebook's environment" if notebook else "this process's environment",
        subject="a function's arguments",
    )
    values = [Value("_air_function", fn, f"`{title}`")]
    values += [
        Value(f"_air_arg{i}", arg, f"argument {i + 1} of `{title}`") for i, arg in enumerate(args)
    ]
    values += [
        Value(f"_air_kwarg{i}", value, f"argument `{key}` of `{title}`")
        for i, (key, value) in enumerate(kwargs.items())
    ]
    payload = pickle_values(values, namespace, max_value_bytes=max_value_bytes, wording=wording)
    arg_names = ", ".join(f"_air_arg{i}" for i in range(len(args)))
    kwarg_items = ", ".join(f"{key!r}: _air_kwarg{i}" for i, key in enumerate(kwargs))
    program = (
        "from air_sdk.runtime.function_call import run_function\n"
        f"run_function(_air_function, [{arg_names}], {{{kwarg_items}}})\n"
    )
    return CellPackage(
        code=render_bootstrap(
            program,
            [],
            filename=CALL_FILENAME,
            made_by="@air_sdk.distributed",
            wording=wording,
        ),
        files={CELL_PICKLE: payload},
        captured=[title.rpartition(".")[2]]
        + [f"argument {i + 1}" for i in range(len(args))]
        + list(kwargs),
        imports=[],
    )


def _globals_of(fn: Callable[..., Any]) -> Mapping[str, Any]:
    """The globals a function of the notebook or script shares (for the persistent id
    that makes them the rank's `__main__`); for other callables, their module's."""
    target = getattr(fn, "__func__", fn)  # a bound method
    if isinstance(target, types.FunctionType):
        return target.__globals__
    module = sys.modules.get(getattr(type(fn), "__module__", "") or "")
    return vars(module) if module is not None else {"__name__": "__main__"}
