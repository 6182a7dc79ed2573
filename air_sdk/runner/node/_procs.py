"""Process helpers of the NodeRunner: identity by pid and start time, a process's
descendants (read from its own /proc entry, never by scanning the host), signals
that tolerate a process already gone, Python stacks (py-spy) and idle-CPU checks.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from air_sdk.procs import alive, create_time, dying, exited

__all__ = [
    "IdleCpu",
    "alive",
    "cold_argv",
    "create_time",
    "descendants",
    "dump_stacks",
    "dying",
    "exited",
    "kill",
    "killpg",
    "payload",
    "set_child_subreaper",
]

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
#: a cold rank starts through this: die with the NodeRunner (parent-death signal), take
#: the job's rlimits ("DATA=N,FSIZE=N" or "-": `node.limits`), then become `python -u
#: SCRIPT` in place. `-S`: no site import, ~10 ms.
_TRAMPOLINE = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "parent = int(sys.argv[1])\n"
    "if parent and os.getppid() != parent: os._exit(137)\n"
    "for item in sys.argv[2].split(',') if sys.argv[2] != '-' else []:\n"
    "    import resource\n"
    "    name, value = item.split('=')\n"
    "    kind = getattr(resource, 'RLIMIT_' + name)\n"
    "    hard = resource.getrlimit(kind)[1]\n"
    "    value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)\n"
    "    resource.setrlimit(kind, (value, value))\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


def cold_argv(
    wrapper: list[str],
    command: list[str],
    parent: int,
    env: Mapping[str, str],
    rlimits: str = "-",
) -> list[str]:
    """A fresh rank's command line: `python -u COMMAND...` (under autolog's import hook
    unless `env` turns it off, see `air_sdk.runtime._rank_main`) that dies with
    `parent` (0: do not check the parent, e.g. behind a wrapper that forks), under
    `rlimits` (`air_sdk.runner.node.limits.rlimit_arg`).

    Example:
        >>> cold_argv([], ["train.py", "--lr", "1"], 42, {"AIR_AUTOLOG": "0"})[-4:]
        ['-u', 'train.py', '--lr', '1']
        >>> cold_argv([], ["train.py"], 42, {})[-2].endswith("_rank_main.py")
        True
    """
    from air_sdk.runtime._rank_main import python_argv

    python = sys.executable
    head = [*wrapper, python, "-S", "-c", _TRAMPOLINE, str(parent), rlimits]
    return [*head, *python_argv(command, env)]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            found.extend(
                int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            )
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc/PID/task/*/children (Linux 3.5+;
    psutil's walk where that file is missing), parents before children.

    Example:
        >>> descendants(os.getpid()) == [] or True
        True
    """
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        import psutil

        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [os.fsdecode(a) for a in raw.split(b"\0") if a]


def payload(pid: int) -> int:
    """The process that runs the program behind a sandbox (`air_sdk.runner.node.sandbox`:
    bwrap or `_jail.py` and their namespace's init stand between); `pid` itself when it
    is no sandbox, or while the sandbox is still being built.

    Example:
        >>> payload(os.getpid()) == os.getpid()
        True
    """
    from air_sdk.runner.node.sandbox import is_sandbox_wrapper

    if not is_sandbox_wrapper(_cmdline(pid)):
        return pid
    for child in descendants(pid):
        argv = _cmdline(child)
        if argv and not is_sandbox_wrapper(argv):
            return child
    return pid


def kill(pid: int, sig: int) -> None:
    """`os.kill` that ignores a process already gone."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def killpg(pgid: int, sig: int) -> None:
    """`os.killpg` that ignores a group already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def set_child_subreaper() -> bool:
    """Make orphans of this process's descendants its children (Linux 3.4+), so a
    process a rank left behind is still found below the NodeRunner; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return (
            int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
        )
    except (OSError, AttributeError):
        return False


def dump_stacks(pids: Mapping[int, int]) -> dict[int, str]:
    """Each process's Python stack by key (rank -> pid), read with `py-spy dump`, which
    also reads a stopped process.

    Example:
        >>> dump_stacks({})
        {}
    """
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    stacks: dict[int, str] = {}
    for key, pid in sorted(pids.items()):
        pid = payload(pid)  # the rank's interpreter, not its sandbox
        if not os.path.exists(spy):
            stacks[key] = "no stack: py-spy is not installed (pip install py-spy)"
            continue
        try:
            out = subprocess.run(
                [spy, "dump", "--nonblocking", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=15,
            )
            stacks[key] = (out.stdout or out.stderr).strip()[-8000:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            stacks[key] = f"no stack: py-spy failed ({exc})"
    return stacks


class IdleCpu:
    """Whether about one core has been idle for the last few looks (/proc/stat).

    Warm interpreters import torch while an attempt's ranks may still be starting:
    measured here (2 cores, 2 ranks importing torch), two warm-ups beside them made
    the ranks' imports 45-55% slower; started once a core was idle, within the noise.

    Example:
        >>> IdleCpu().spare() in (True, False)
        True
    """

    #: "idle" must hold this many looks in a row
    LOOKS = 3

    def __init__(self) -> None:
        self._sample: tuple[int, int] | None = None
        self._looks = 0

    def reset(self) -> None:
        self._looks = 0

    def spare(self) -> bool:
        sample = _cpu_times()
        if sample is None:
            return True
        previous, self._sample = self._sample, sample
        if previous is None:
            return False
        idle, total = sample[0] - previous[0], sample[1] - previous[1]
        if total > 0 and idle / total >= 1.0 / (os.cpu_count() or 1):
            self._looks += 1
        else:
            self._looks = 0
        return self._looks >= self.LOOKS


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) clock ticks of all CPUs since boot; None without /proc."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (ticks[3] + ticks[4], sum(ticks)) if len(ticks) >= 5 else None


def signal_name(code: int) -> str:
    """A signal's name from its number."""
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"SIG{code}"
