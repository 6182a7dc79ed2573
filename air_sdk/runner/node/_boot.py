"""Runs inside a warm interpreter: import torch ahead of time, then become a rank.

    python -u -c BOOT .../_boot.py air-warm-rank --parent=PID --status-fd=N MODULE...

The NodeRunner starts this with the job's environment (less what changes from one
attempt to the next) in the job's code directory, while an attempt runs, so the
next attempt's ranks need not start Python and import torch again:

    NodeRunner                              warm interpreter
    ----------                              ----------------
    Popen(..., pass_fds=(status,))      ->  PDEATHSIG=SIGKILL; import MODULE... in a
                                            nice(10) thread (its session: the NodeRunner's)
    status pipe: reads b"R"             <-  imports done
    stdin: one JSON line                ->  {"argv", "env", "cwd", "rlimits"} of a rank
    (EOF: not needed any more)          ->  exits
                                            setsid() (a session of its own, as every
                                            rank), chdir, takes the env, then runs the
                                            script in a fresh `__main__` as
                                            `python -u SCRIPT ARGS` would

Its stdout and stderr are the rank's output pipe from the start. An uncaught
exception prints the script's traceback (this file's frames left out) and exits 1,
as `python` does. Run as a plain file (`BOOT`), so it imports nothing but the
standard library until it imports what it warms.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
import traceback
from typing import Any

MARKER = "air-warm-rank"
#: `python -c BOOT PATH_OF_THIS_FILE ...`: runs this file outside `__main__` (the script
#: gets a `__main__` of its own, as under `python SCRIPT`)
BOOT = (
    "import sys; sys.path.pop(0); path = sys.argv.pop(1);"
    " exec(compile(open(path).read(), path, 'exec'), {'__name__': '__air_boot__', '__file__': path})"
)
_IMPORT_NICE = 10
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # the NodeRunner died before prctl took effect
        os._exit(0)


def _warm_up(modules: list[str], status_fd: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, _IMPORT_NICE)  # Linux: this thread only
    except OSError:
        pass
    import importlib

    try:
        for name in modules:
            importlib.import_module(name)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    try:
        os.write(status_fd, b"R")
    except OSError:
        os._exit(0)  # nobody listens: the NodeRunner is gone


def _set_rlimits(arg: str) -> None:
    """The job's rlimits ("DATA=N,FSIZE=N", "-" for none: `node.limits.rlimit_arg`),
    soft and hard, as a cold rank's trampoline sets them (`_procs._TRAMPOLINE`)."""
    import resource

    for item in arg.split(",") if arg != "-" else []:
        name, value = item.split("=")
        kind = getattr(resource, "RLIMIT_" + name)
        hard = resource.getrlimit(kind)[1]
        limit = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(kind, (limit, limit))


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        data += chunk
    return data


def _script_frames(tb: Any) -> Any:
    """The traceback from the script's first frame on (ours and runpy's left out)."""
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if os.path.abspath(name) not in ours and not name.startswith("<frozen runpy"):
            break
        tb = tb.tb_next
    return tb


def _run_script(path: str) -> None:
    """Run `path` in `__main__` as `python PATH` does: `__file__` absolute, `sys.argv[0]`
    as given, the script's directory first on `sys.path`."""
    import builtins
    import types

    absolute = os.path.abspath(path)
    sys.path.insert(0, os.path.dirname(absolute))
    main = types.ModuleType("__main__")
    main.__file__ = absolute
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    with open(absolute, "rb") as f:  # compile() reads the coding cookie, as python does
        code = compile(f.read(), absolute, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def run_as_main(argv: list[str]) -> None:
    """Run `argv` ([SCRIPT, ARGS...] or ["-m", MODULE, ARGS...]) as `python -u` would,
    in this process: the same exit status, the same traceback."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            as_main = getattr(runpy, "_run_module_as_main", None)  # what `python -m` runs
            if as_main is not None:
                as_main(argv[1], alter_argv=True)
            else:
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            _run_script(argv[0])
    except SystemExit:
        raise
    except BaseException as exc:
        tb = _script_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # it prints the exception's own
        if isinstance(exc, KeyboardInterrupt):  # as python: die of SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)


def main(args: list[str]) -> None:
    parent = int(next(a for a in args if a.startswith("--parent=")).split("=", 1)[1])
    status_fd = int(next(a for a in args if a.startswith("--status-fd=")).split("=", 1)[1])
    modules = [a for a in args if not a.startswith("--") and a != MARKER]
    _die_with_parent(parent)
    importer = threading.Thread(
        target=_warm_up, args=(modules, status_fd), name="air-warm-import", daemon=True
    )
    importer.start()
    line = _read_line(0)
    if not line:  # not needed any more, or the NodeRunner is gone
        os._exit(0)
    command = json.loads(line)
    try:
        os.setsid()  # a session (and process group) of its own, as every rank
    except OSError:
        pass
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(command["cwd"])
    _set_rlimits(command.get("rlimits", "-"))
    os.environ.clear()
    os.environ.update(command["env"])
    importer.join()
    os.close(status_fd)
    # autolog's import hook, as a cold rank gets it from `_rank_main` (AIR's runtime is
    # among what was warmed, so this costs nothing)
    from air_sdk.runtime import _rank_main

    if _rank_main.enabled(os.environ):
        _rank_main.install()
    run_as_main(command["argv"])


if __name__ == "__air_boot__":
    main(sys.argv[1:])
