"""Packaging a notebook cell to run on every rank of a job.

The cell's source becomes the program. What it uses from earlier cells travels
with it:

- names bound to modules are imported again on the workers
  (`import numpy as np`, `from torch import nn`);
- functions, classes and values are pickled with cloudpickle: the notebook's
  own (`__main__`) functions and classes by value, anything imported from an
  installed module by reference (the worker imports it again);
- nothing from `os.environ` travels (a name bound to `os.environ` is bound to
  the worker's own), and a pickle that holds the value of a secret-looking
  environment variable is refused.

On the worker, the functions of the notebook share the rank's `__main__`
globals with the cell, as they shared the notebook's: a helper from an earlier
cell sees the `model` the train cell builds. Tracebacks show the cell's own
line numbers and lines (`File "<air cell>", line 7`).

A value that cannot be pickled (a lock, a socket, a database connection, a
generator), or one over `max_value_bytes` (sized cheaply before pickling, so a
2 GiB tensor is never copied), raises `CellCaptureError` naming the variable
and what to do instead, before anything is uploaded.

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

import ast
import builtins
import dis
import itertools
import os
import re
import symtable
import sys
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from air_sdk.errors import SpecError
from air_sdk.redact import is_secret_name

__all__ = [
    "CELL_FILENAME",
    "CELL_PICKLE",
    "DEFAULT_MAX_VALUE_BYTES",
    "CellCaptureError",
    "CellPackage",
    "collect_files",
    "free_names",
    "package_cell",
]

#: the pickled namespace, next to the bootstrap in the bundle
CELL_PICKLE = "__air_cell__.pkl"
#: the name tracebacks give the cell
CELL_FILENAME = "<air cell>"
#: the largest value (after pickling) that may travel with a cell
DEFAULT_MAX_VALUE_BYTES = 64 << 20
#: --files larger than this in all are refused before they are read (the bundle limit)
MAX_FILES_BYTES = 512 << 20

_FORMAT_VERSION = 1
_MAIN_GLOBALS_ID = "__main__"
_PICKLE_PROTOCOL = 5

# IPython's own names (history, output cache, helpers), never the user's data.
_SHELL_NAMES = frozenset(
    {
        "In",
        "Out",
        "_",
        "__",
        "___",
        "_ih",
        "_oh",
        "_dh",
        "_sh",
        "_exit_code",
        "get_ipython",
        "exit",
        "quit",
        "_air_job",
    }
)
_SHELL_NAME = re.compile(r"_(i{1,3}|i?\d+)|__\w+__")
_MIN_SECRET_CHARS = 6
# Sizing walks at most this many objects, this deep: a lower bound, cheap on any value.
_MAX_SIZED_OBJECTS = 10_000
_MAX_SIZING_DEPTH = 6
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"})
_SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".ipynb_checkpoints"})
_TOO_LARGE_ADVICE = (
    "load it inside the cell (torch.load / a dataset path) or save it to a file and pass"
    " that with --files"
)


class CellCaptureError(SpecError):
    """A cell cannot travel: it is not Python, or a value it uses cannot be sent.

    Example:
        >>> import threading
        >>> package_cell("lock.acquire()", {"lock": threading.Lock()})
        Traceback (most recent call last):
        ...
        air_sdk.notebook.capture.CellCaptureError: `lock` (_thread.lock) cannot be sent to the workers: create it inside the cell
    """


@dataclass(frozen=True)
class CellPackage:
    """A cell ready to submit: `JobSpec.code` plus the files to add to the bundle.

    Example:
        >>> package = package_cell("x = 1", {})
        >>> client.submit(job_spec(code=package.code), extra_files=package.files)  # doctest: +SKIP
    """

    code: str
    """The bootstrap every rank runs: loads `CELL_PICKLE`, imports, runs the cell."""
    files: dict[str, bytes] = field(repr=False)
    """Bundle path -> bytes (the pickled namespace)."""
    captured: list[str]
    """Names pickled from the notebook, in the order the cell first uses them."""
    imports: list[str]
    """Import lines the workers run again, e.g. `import numpy as np`."""


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
    names = free_names(source)
    imports: list[str] = []
    values: list[tuple[str, Any]] = []
    for name in names:
        if name in _SHELL_NAMES or _SHELL_NAME.fullmatch(name) or name not in namespace:
            continue
        value = namespace[name]
        if value is getattr(builtins, name, _MISSING):
            continue
        line = _import_line(name, value)
        if line is not None:
            imports.append(line)
        else:
            values.append((name, value))
    payload, spans = _pickle_values(values, namespace, max_value_bytes)
    _refuse_secrets(payload, spans)
    return CellPackage(
        code=_bootstrap(source, imports),
        files={CELL_PICKLE: payload},
        captured=[name for name, _ in values],
        imports=imports,
    )


# -- which names a cell uses ---------------------------------------------------------------


def free_names(source: str) -> list[str]:
    """Names `source` reads from outside itself, in order of first use.

    A name counts when the cell reads it at module level before binding it, or
    reads it as a global inside a function, class or comprehension while the cell
    never binds it at module level. Builtins count too (the caller skips them).

    Raises:
        CellCaptureError: the source is not valid Python.

    Example:
        >>> free_names("x = load(path)\\nprint(x, y)\\ndef f():\\n    return z + x")
        ['load', 'path', 'print', 'y', 'z']
    """
    try:
        tree = ast.parse(source, CELL_FILENAME)
        table = symtable.symtable(source, CELL_FILENAME, "exec")
    except SyntaxError as exc:
        raise CellCaptureError(
            f"line {exc.lineno} of the cell is not Python ({exc.msg}): %magics and !shell"
            " commands do not run on the workers; remove them or use subprocess"
        ) from exc
    reads = _global_reads(table)
    bound_here = {
        sym.get_name()
        for sym in table.get_symbols()
        if sym.is_assigned() or sym.is_imported() or sym.is_namespace()
    }
    order = _ModuleOrder()
    order.visit(tree)
    return [
        name
        for name in _names_in_order(tree)
        if name in order.read_first or (name in reads and name not in bound_here)
    ]


def _global_reads(table: symtable.SymbolTable) -> set[str]:
    reads = {sym.get_name() for sym in table.get_symbols() if sym.is_referenced()}
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        stack.extend(child.get_children())
        # `global total; total += 1` in a function reads the notebook's `total` too.
        reads.update(
            sym.get_name()
            for sym in child.get_symbols()
            if sym.is_global() and (sym.is_referenced() or sym.is_declared_global())
        )
    return reads


def _names_in_order(tree: ast.AST) -> list[str]:
    found = sorted(
        (node.lineno, node.col_offset, node.id)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name)
    )
    return list(dict.fromkeys(name for _, _, name in found))


class _ModuleOrder(ast.NodeVisitor):
    """Walks module-level code in evaluation order; `read_first` holds the names read
    there before the cell binds them (`x = x + 1` reads the notebook's `x`).
    Function and class bodies run later (or in their own scope) and are not walked."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.read_first: set[str] = set()

    def _read(self, name: str) -> None:
        if name not in self.bound:
            self.read_first.add(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._read(node.id)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self._read(node.target.id)
        self.visit(node.value)
        self.visit(node.target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for stmt in (*node.body, *node.orelse):
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self.bound.add(alias.asname or alias.name.partition(".")[0])

    visit_ImportFrom = visit_Import

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        for expr in (*node.decorator_list, *args.defaults, *args.kw_defaults):
            if expr is not None:
                self.visit(expr)
        self.bound.add(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in (*node.args.defaults, *node.args.kw_defaults):
            if expr is not None:
                self.visit(expr)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
            self.visit(expr)
        self.bound.add(node.name)

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
    ) -> None:
        # The first iterable is evaluated in the module; the rest in the comprehension's
        # own scope, where only its targets are local.
        self.visit(node.generators[0].iter)
        local = {
            n.id for gen in node.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)
        }
        rest: list[ast.AST] = [*node.generators[1:]]
        rest += [cond for gen in node.generators for cond in gen.ifs]
        rest += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for part in rest:
            for n in ast.walk(part):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
                    self._read(n.id)

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bound.add(node.name)
        for stmt in node.body:
            self.visit(stmt)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.pattern is not None:
            self.visit(node.pattern)
        if node.name:
            self.bound.add(node.name)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.bound.add(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self.generic_visit(node)
        if node.rest:
            self.bound.add(node.rest)


# -- what travels how ----------------------------------------------------------------------


class _Missing:
    pass


_MISSING = _Missing()


def _import_line(name: str, value: Any) -> str | None:
    """The import that rebinds `name` on a worker, or None for a value to pickle."""
    if value is os.environ:
        return "from os import environ" + ("" if name == "environ" else f" as {name}")
    if not isinstance(value, types.ModuleType):
        return None
    module = value.__name__
    if module == "__main__" or sys.modules.get(module) is not value:
        raise CellCaptureError(
            f"`{name}` is a module that cannot be imported again by name ({module!r}):"
            " import it inside the cell"
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


class _CellPickler(cloudpickle.Pickler):
    """cloudpickle, except that the notebook's globals become the rank's `__main__`
    globals on load (a persistent id), so functions see what the cell binds."""

    def __init__(self, file: _BoundedBuffer, namespace: Mapping[str, Any]) -> None:
        super().__init__(file, protocol=_PICKLE_PROTOCOL)
        self._main_globals: dict[str, Any] = {}
        globals_ref = getattr(self, "globals_ref", None)
        if isinstance(globals_ref, dict):  # cloudpickle's map: id(func.__globals__) -> dict
            globals_ref[id(namespace)] = self._main_globals

    def persistent_id(self, obj: Any) -> str | None:
        return _MAIN_GLOBALS_ID if obj is self._main_globals else None


def _pickle_values(
    values: Sequence[tuple[str, Any]], namespace: Mapping[str, Any], max_value_bytes: int
) -> tuple[bytes, list[tuple[str, int, int]]]:
    """A header, then one pickle per value through one pickler (shared objects are
    pickled once). Returns the bytes and each name's byte span."""
    buffer = _BoundedBuffer(max(max_value_bytes, 1 << 20))
    pickler = _CellPickler(buffer, namespace)
    pickler.dump({"format": _FORMAT_VERSION, "names": [name for name, _ in values]})
    spans = []
    main_name = namespace.get("__name__", "__main__")
    for name, value in values:
        size, uses = _sized(value, main_name)
        if size > max_value_bytes:
            raise CellCaptureError(_too_large(name, value, size, max_value_bytes, uses))
        buffer.limit = max_value_bytes
        start = buffer.mark()
        try:
            pickler.dump(value)
        except _ValueTooLarge:
            raise CellCaptureError(
                _too_large(name, value, None, max_value_bytes, _global_names(value, main_name))
            ) from None
        except Exception as exc:
            raise CellCaptureError(_cannot_send(name, value, exc, main_name)) from exc
        spans.append((name, start, len(buffer.data)))
    return bytes(buffer.data), spans


def _type_name(value: Any) -> str:
    cls = type(value)
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


def _cannot_send(name: str, value: Any, exc: Exception, main_name: str) -> str:
    kind = _type_name(value)
    reason = str(exc).strip() or type(exc).__name__
    uses = _global_names(value, main_name)
    if uses:
        return (
            f"`{name}` ({kind}) cannot be sent to the workers ({reason}): it uses"
            f" {_listed(uses)} from the notebook; create what cannot travel inside the cell"
        )
    detail = "" if kind in reason else f" ({reason})"
    return f"`{name}` ({kind}) cannot be sent to the workers{detail}: create it inside the cell"


def _too_large(name: str, value: Any, size: int | None, limit: int, uses: Sequence[str]) -> str:
    limit_text = _human_bytes(limit)
    if uses:
        carried = (
            f"carries {_human_bytes(size)}" if size is not None else f"pickles to over {limit_text}"
        )
        return (
            f"`{name}` ({_type_name(value)}) {carried} through {_listed(uses)} from the notebook;"
            f" the limit is {limit_text}: {_TOO_LARGE_ADVICE}"
        )
    if size is None:
        return (
            f"`{name}` ({_type_name(value)}) pickles to over {limit_text}; the limit is"
            f" {limit_text}: {_TOO_LARGE_ADVICE}"
        )
    return f"`{name}` is a {_human_bytes(size)} {_kind(value)}; the limit is {limit_text}: {_TOO_LARGE_ADVICE}"


def _kind(value: Any) -> str:
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return "tensor"
        if isinstance(value, torch.nn.Module):
            return f"model ({type(value).__qualname__})"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "array"
    return _type_name(value)


def _listed(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _human_bytes(num_bytes: int) -> str:
    value = float(num_bytes)
    unit = "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "bytes":
        return f"{num_bytes:,} bytes"
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"


# -- sizing before pickling ----------------------------------------------------------------


def _sized(value: Any, main_name: str) -> tuple[int, list[str]]:
    """A lower bound of the bytes `value` pickles to, from the arrays, tensors, bytes and
    strings it holds (never copying them); and, for a notebook function or class, the
    globals that travel with it."""
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    uses = _global_names(value, main_name)
    seen: set[int] = set()
    total = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    for _ in range(_MAX_SIZED_OBJECTS):
        if not stack:
            break
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if torch is not None and isinstance(obj, torch.Tensor):
            total += _tensor_nbytes(obj)
        elif numpy is not None and isinstance(obj, numpy.ndarray):
            total += int(obj.nbytes)
        elif isinstance(obj, str | bytes | bytearray):
            total += len(obj)
        elif depth < _MAX_SIZING_DEPTH:
            stack.extend((child, depth + 1) for child in _children(obj, main_name, torch))
    return total, uses


def _tensor_nbytes(tensor: Any) -> int:
    try:  # a view pickles its whole storage
        return int(tensor.untyped_storage().nbytes())
    except Exception:  # sparse, nested and other storage-less tensors
        return int(tensor.element_size() * tensor.nelement())


def _children(obj: Any, main_name: str, torch: Any) -> Iterator[Any]:
    cap = _MAX_SIZED_OBJECTS
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


def _global_names(value: Any, main_name: str) -> list[str]:
    """Notebook globals that travel with a notebook function or class (not modules)."""
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


# -- secrets -------------------------------------------------------------------------------


def _refuse_secrets(payload: bytes, spans: Sequence[tuple[str, int, int]]) -> None:
    for key, secret in os.environ.items():
        # Which names hold secrets is decided in one place, air_sdk.redact.
        if len(secret) < _MIN_SECRET_CHARS or not is_secret_name(key):
            continue
        at = payload.find(secret.encode("utf-8", "surrogateescape"))
        if at < 0:
            continue
        name = next((n for n, start, end in spans if start <= at < end), "a value")
        raise CellCaptureError(
            f"`{name}` holds the value of ${key} from the notebook's environment, and"
            f" secrets do not travel with a cell: pass it with --env {key}=... and read"
            f" os.environ[{key!r}] inside the cell"
        )


# -- the program every rank runs -----------------------------------------------------------

_BOOTSTRAP = """\
# Generated by AIR (%%air train): loads what the cell uses from the notebook, then
# runs the cell itself, so tracebacks show the cell's own lines.
import linecache as _air_linecache
import os as _air_os
import pickle as _air_pickle

import cloudpickle as _air_cloudpickle  # noqa: F401  (the pickled functions need it)


def _air_load_notebook_values():
    here = _air_os.path.dirname(_air_os.path.abspath(globals().get("__file__", "x")))
    namespace = globals()

    class Unpickler(_air_pickle.Unpickler):
        def persistent_load(self, pid):
            if pid == {main_id!r}:
                return namespace  # the notebook's globals are this rank's __main__
            raise _air_pickle.UnpicklingError(f"unknown persistent id {{pid!r}}")

    with open(_air_os.path.join(here, {pickle_name!r}), "rb") as f:
        unpickler = Unpickler(f)
        header = unpickler.load()
        if header.get("format") != {version!r}:
            raise RuntimeError(
                "this cell was packaged by another AIR version: install the notebook's"
                " air-runtime where the workers run"
            )
        for name in header["names"]:
            try:
                namespace[name] = unpickler.load()
            except Exception as exc:
                raise RuntimeError(
                    f"could not load `{{name}}` from the notebook on this worker: {{exc}};"
                    " install what it needs where the workers run, or create it inside the cell"
                ) from exc


def _air_show_cell_tracebacks():
    import sys
    import traceback

    bootstrap = _air_show_cell_tracebacks.__code__.co_filename

    def excepthook(etype, value, tb):
        # The Python traceback printer reads the cell's lines from linecache (the
        # default hook reads files), and the bootstrap's own frames are left out.
        cell_tb = tb
        while cell_tb is not None and cell_tb.tb_frame.f_code.co_filename == bootstrap:
            cell_tb = cell_tb.tb_next
        traceback.print_exception(etype, value, cell_tb or tb)

    sys.excepthook = excepthook


def _air_compile_cell():
    source = {source!r}
    lines = source.splitlines(True)
    _air_linecache.cache[{filename!r}] = (len(source), None, lines, {filename!r})
    code = compile(source, {filename!r}, "exec", dont_inherit=True)
    for name in {bootstrap_names!r}:  # the cell sees only its own and the notebook's names
        globals().pop(name, None)
    return code


_air_show_cell_tracebacks()
_air_load_notebook_values()
{imports}
exec(_air_compile_cell(), globals())
"""


_BOOTSTRAP_NAMES = (
    "_air_linecache",
    "_air_os",
    "_air_pickle",
    "_air_cloudpickle",
    "_air_show_cell_tracebacks",
    "_air_load_notebook_values",
    "_air_compile_cell",
)


def _bootstrap(source: str, imports: Sequence[str]) -> str:
    return _BOOTSTRAP.format(
        main_id=_MAIN_GLOBALS_ID,
        pickle_name=CELL_PICKLE,
        version=_FORMAT_VERSION,
        source=source,
        filename=CELL_FILENAME,
        imports="\n".join(imports),
        bootstrap_names=_BOOTSTRAP_NAMES,
    )


# -- extra files ---------------------------------------------------------------------------


def collect_files(
    paths: Iterable[str | Path], root: Path, *, max_bytes: int = MAX_FILES_BYTES
) -> dict[str, bytes]:
    """Read files and directories to send with a cell (`--files`), keyed by bundle path.

    A path inside `root` keeps its place relative to `root`; one outside lands at the
    bundle's top level under its own name. Directories are read whole, except
    `__pycache__`, `.git` and `.ipynb_checkpoints`. Sizes are checked before reading.

    Raises:
        CellCaptureError: a path does not exist, or the files are over `max_bytes`.

    Example:
        >>> collect_files(["data/vocab.txt"], Path.cwd())  # doctest: +SKIP
        {'data/vocab.txt': b'...'}
    """
    root = Path(root).resolve()
    found: dict[str, Path] = {}
    for raw in paths:
        path = (root / Path(raw).expanduser()).resolve()
        if not path.exists():
            raise CellCaptureError(
                f"--files {raw}: no such file or directory (relative paths start at {root})"
            )
        base = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
        if path.is_file():
            found[base.as_posix()] = path
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
            for filename in sorted(filenames):
                file = Path(dirpath, filename)
                if file.is_file():
                    found[(base / file.relative_to(path)).as_posix()] = file
    total = sum(file.stat().st_size for file in found.values())
    if total > max_bytes:
        largest = max(found, key=lambda name: found[name].stat().st_size)
        raise CellCaptureError(
            f"--files holds {_human_bytes(total)}; the limit is {_human_bytes(max_bytes)}"
            f" (largest: {largest}): read large data from shared storage inside the cell"
        )
    return {name: file.read_bytes() for name, file in found.items()}
