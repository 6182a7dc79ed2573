"""Which names a notebook cell uses from earlier cells.

`free_names` reads the cell's source (`ast` for the order of module-level code,
`symtable` for the scopes of functions, classes and comprehensions) and returns
the names it reads from outside itself; `is_shell_name` says which of those are
IPython's own (history, output cache), never the user's data.

Example:
    >>> free_names("x = load(path)\\nprint(x)")
    ['load', 'path', 'print']
    >>> is_shell_name("_i3"), is_shell_name("lr")
    (True, False)
"""

from __future__ import annotations

import ast
import re
import symtable

from air_sdk.errors import CellCaptureError
from air_sdk.notebook.bootstrap import CELL_FILENAME

__all__ = ["free_names", "is_shell_name"]

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


def is_shell_name(name: str) -> bool:
    """True for IPython's history, output cache and helpers (`In`, `_i3`, `_5`, `__x__`).

    Example:
        >>> is_shell_name("Out"), is_shell_name("__name__"), is_shell_name("model")
        (True, True, False)
    """
    return name in _SHELL_NAMES or _SHELL_NAME.fullmatch(name) is not None


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
