"""How a rank's Python starts under AIR: autolog's import hook, then the user's program.

The rank supervisor runs

    python -u .../air_sdk/runtime/_rank_main.py SCRIPT [ARGS...]
    python -u .../air_sdk/runtime/_rank_main.py -m MODULE [ARGS...]

in place of `python -u SCRIPT ARGS` when autolog is on (the default; `AIR_AUTOLOG=0`
turns it off). It puts an `ImportHook` first on `sys.meta_path` that watches the few
modules where Lightning, transformers and accelerate define their Trainer and
Accelerator classes, then runs the program as `python SCRIPT` would: a fresh
`__main__` module, `sys.argv`, `sys.path[0]` the script's directory (the working
directory for `-m`), and a traceback that starts in the user's code. When one of the
watched modules finishes loading, the hook hands it to `air_sdk.runtime._autolog`,
which patches the class; until then nothing of AIR is imported.

The hook costs one set lookup per module imported: rank start-up stays as it was
when none of the libraries is used (see docs/benchmarks.md, "autolog").

This file runs as a script before anything else, so it imports only modules the
interpreter has loaded anyway.
"""

from __future__ import annotations

import os
import sys
import types

TYPE_CHECKING = False  # typing is not loaded yet when this runs, and need not be
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

__all__ = ["ENV", "ImportHook", "enabled", "import_hook", "install", "main", "python_argv"]

#: the attribute that marks AIR's hook on sys.meta_path (found by duck typing: this file
#: runs as `__main__` and may be imported again as a module, with a second class object)
MARKER = "air_import_hook"


class _Loader:
    """Runs the real loader, then the callbacks waiting for the module."""

    def __init__(self, hook: ImportHook, loader: Any) -> None:
        self._hook = hook
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            # The module keeps its own loader: inspect, importlib.resources and pickle
            # never see this wrapper.
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        self._hook.loaded(module)


class ImportHook:
    """A `sys.meta_path` finder that calls back when a watched module has been executed.

    Every other module is passed over with one set lookup. A callback that raises is
    reported on stderr and does not fail the import.

    Example:
        >>> hook = ImportHook()
        >>> hook.watch("json.tool", lambda module: print("loaded", module.__name__))
        >>> hook.watching("json.tool")
        True
    """

    air_import_hook = True

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callable[[types.ModuleType], None]]] = {}
        self._busy: set[str] = set()

    def watch(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        """Call `callback(module)` once `name` is imported (at once if it already is)."""
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None:
            _safely(callback, module)
            return
        self._callbacks.setdefault(name, []).append(callback)

    def watching(self, name: str) -> bool:
        return name in self._callbacks

    def forget(self, name: str) -> None:
        self._callbacks.pop(name, None)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self._callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or getattr(finder, MARKER, False):
                    continue
                find = getattr(finder, "find_spec", None)
                if find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(self, spec.loader)
        return spec

    def loaded(self, module: types.ModuleType) -> None:
        for callback in self._callbacks.pop(module.__name__, []):
            _safely(callback, module)

    def invalidate_caches(self) -> None:
        pass


def _safely(callback: Callable[[types.ModuleType], None], module: types.ModuleType) -> None:
    try:
        callback(module)
    except Exception as exc:  # training must go on without AIR's view of it
        print(f"air: autolog for {module.__name__} failed: {exc!r}", file=sys.stderr, flush=True)


def import_hook() -> ImportHook:
    """AIR's hook on `sys.meta_path`, put first there if it is not yet.

    Example:
        >>> import_hook() is import_hook()
        True
    """
    for finder in sys.meta_path:
        if getattr(finder, MARKER, False):
            return finder  # type: ignore[return-value]
    hook = ImportHook()
    sys.meta_path.insert(0, hook)
    return hook


#: `0` (or false/no/off) in a rank's environment: start the rank without autolog
ENV = "AIR_AUTOLOG"
_OFF = ("0", "false", "no", "off")


def enabled(env: Mapping[str, str]) -> bool:
    """Whether a rank with this environment starts under autolog (default: yes).

    Example:
        >>> enabled({}), enabled({"AIR_AUTOLOG": "0"})
        (True, False)
    """
    return env.get(ENV, "").strip().lower() not in _OFF


def python_argv(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The command line that runs `argv` (SCRIPT ARGS or -m MODULE ARGS) as a rank:
    `python -u` under this file when autolog is on, plain `python -u` when it is off.

    Example:
        >>> python_argv(["train.py"], {"AIR_AUTOLOG": "0"})[1:]
        ['-u', 'train.py']
    """
    if enabled(env):
        return [sys.executable, "-u", os.path.abspath(__file__), *argv]
    return [sys.executable, "-u", *argv]


def install() -> ImportHook:
    """Put the import hook first on sys.meta_path, watching the modules autolog patches.
    (What a launcher that runs the script in-process calls before running it.)"""

    # The names are autolog's WATCHED (kept equal by a test); not imported from there,
    # as that would load air_sdk before the user's program starts.
    def attach(module: types.ModuleType) -> None:
        from air_sdk.runtime._autolog import attach_to

        attach_to(module)

    hook = import_hook()
    for name in (
        "lightning.pytorch.trainer.trainer",
        "pytorch_lightning.trainer.trainer",
        "transformers.trainer",
        "accelerate.accelerator",
        "accelerate.optimizer",
    ):
        if not hook.watching(name):
            hook.watch(name, attach)
    return hook


def _run_script(path: str) -> None:
    """Run `path` as `python path` does; a traceback starts in the user's code."""
    if os.path.isdir(path) or not path.endswith((".py", ".pyw")) and _is_zip(path):
        import runpy  # a directory or zip with __main__.py, as python runs them

        runpy.run_path(path, run_name="__main__")
        return
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:  # what python itself says, with its exit status
        print(f"{sys.executable}: can't open file {path!r}: {exc}", file=sys.stderr)
        sys.exit(2)
    path = os.path.abspath(path)  # python 3.9+: a script's __file__ is absolute
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    loader_class: Any = type(globals().get("__loader__"))
    if hasattr(loader_class, "get_source"):
        main.__loader__ = loader_class("__main__", path)
    main.__file__ = path
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # python prints from the exception's own traceback: drop this frame there
        traceback = exc.__traceback__
        exc.__traceback__ = traceback.tb_next if traceback else None
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def main(argv: Sequence[str]) -> None:
    """Install autolog's import hook and run `SCRIPT ARGS` or `-m MODULE ARGS`."""
    args = list(argv)
    if not args or args == ["-m"]:
        print("usage: _rank_main.py SCRIPT [ARGS...] | -m MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    install()
    if args[0] == "-m":
        import runpy

        sys.argv = [args[1], *args[2:]]  # runpy puts the module's path in argv[0]
        _set_path0(os.getcwd())
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    script = args[0]
    sys.argv = args
    _set_path0(os.path.dirname(os.path.realpath(script)))
    _run_script(script)


def _set_path0(directory: str) -> None:
    # sys.path[0] is this file's directory now; python would have put the script's
    # there (nothing, with -P / PYTHONSAFEPATH)
    if getattr(sys.flags, "safe_path", False):
        return
    sys.path[0] = directory


if __name__ == "__main__":
    main(sys.argv[1:])
