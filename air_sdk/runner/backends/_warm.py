"""Warm agents: interpreters that already imported torchrun, waiting for a launch.

A cold node start is a fresh `python -m torch.distributed.run`: about 2 s of
interpreter start-up and `import torch` (measured here) before the agent even
joins the rendezvous, paid again by every restart. A torchrun agent with
`--max-restarts` does not pay it (it stays up), so the local backend keeps a
small pool of processes that did those imports ahead of time:

    parent (gateway)                       warm process (the gateway's session)
    ----------------                       ------------------------------------
    Popen(python -c BOOT _warm.py ...)  -> PDEATHSIG=SIGKILL; import torchrun in a
    (once about a core is idle)            nice(10) thread
    stdout pipe: reads b"R"            <-  "ready" (also shown in its command line)
    stdin pipe: one JSON line          ->  {"argv", "env", "cwd", "log"}
    (EOF: pool closed / parent died)   ->  exits
                                           setsid() (its own session, as a cold
                                           agent), clears PDEATHSIG (a job outlives
                                           the gateway), dup2s the log onto fds 1
                                           and 2, chdir, takes the env, then runs
                                           torch.distributed.run's main() in-process

`/proc/PID/environ` and `/proc/PID/cmdline` show what the process was started
with, not what `os.environ` says later; the teardown sweep and re-attaching after
a gateway restart find agents by them. So the warm process starts with a padding
variable placed first in its environment and a padding argument, and on launch
overwrites those bytes in place (through /proc/self/mem) with the attempt's
environment and the agent's real command line. Everything after the padding is
left as it was, so a C pointer some library kept into the old strings stays valid.
Where that cannot be done (layout not as expected, environment too large, import
not finished) the process `execve`s the cold command instead: same pid, same
session, a cold start. A warm agent also polls its local c10d rendezvous every
50 ms rather than every second (`air_sdk._agent.tune_rendezvous`, as cold agents).

This module runs in the warm process as a plain file (`runpy.run_path`), so it
imports nothing but the standard library at module level.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["MARKER", "PAD_VAR", "READY_WORD", "WarmAgent", "WarmAgentPool", "import_sensitive"]

log = logging.getLogger(__name__)

#: first variable of a warm process's environment: the room its attempt env is written into
PAD_VAR = "AIR_WARM_PAD"
#: bytes of room for the attempt's environment beyond the gateway's own
_ENV_SLACK = 16 * 1024
#: Linux refuses a single argv/env string over 32 pages (MAX_ARG_STRLEN)
_MAX_STRING = 32 * 4096 - 1
#: bytes of room for the agent's command line
_ARGV_ROOM = 2048
#: niceness of the importing thread. With autogroup scheduling (on by default in
#: most kernels) niceness only ranks threads within one session, and every rank has
#: a session of its own: a warm process therefore stays in the gateway's session
#: until it takes a command (sharing the gateway's CPU share, not adding one), and
#: warming waits for an idle core (`_cpu_to_spare`).
_IMPORT_NICE = 10
#: start warming only while about a core is idle, but never wait longer than this.
#: Measured here (2 cores, 2 ranks importing torch): two warm-ups in sessions of
#: their own made the ranks' imports 45-55% slower, in the gateway's 20-30%, and
#: started once a core was idle, within the noise.
_SPARE_CPU_WAIT_S = 20.0
#: "idle" must hold this many 0.5 s looks in a row: the gap while a new attempt's
#: agents meet (about 0.5 s) comes just before its ranks start importing torch
_SPARE_CPU_LOOKS = 3
#: the word in a warm process's command line that says its imports are done
READY_WORD = "ready"
MARKER = "air-warm-agent"
_BOOT = "import runpy, sys; sys.path.pop(0); runpy.run_path(sys.argv[1], run_name='__main__')"
#: the commands a warm process can become in place: a stock torchrun agent, or AIR's
_AGENTS = (["-m", "torch.distributed.run"], ["-m", "air_sdk._agent"])


def import_sensitive(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape an interpreter while it starts and imports torch: a
    warm process serves only attempts that agree with it on these."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(("PYTHON", "LD_", "TORCH", "MALLOC_", "GLIBC_")) or k == "LOGLEVEL"
    }


def _env_block(env: Mapping[str, str]) -> bytes:
    """`env` as the kernel lays it out, NUL-terminated, plus an empty entry (readers such
    as psutil stop at the first one)."""
    return b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items()) + b"\0"


# -- the parent side -----------------------------------------------------------------------


@dataclass
class WarmAgent:
    """One warm process, idle until `launch` hands it an agent's command."""

    proc: subprocess.Popen[bytes]
    #: the environment it was started with (less the padding)
    start_env: dict[str, str]
    #: bytes its attempt environment may take
    env_room: int
    started: float = field(default_factory=time.monotonic)
    ready: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll_ready(self) -> bool:
        """True once its imports are done; never blocks."""
        if self.ready or self.proc.stdout is None:
            return self.ready
        fd = self.proc.stdout.fileno()
        try:
            readable, _, _ = select.select([fd], [], [], 0)
            if readable and b"R" in os.read(fd, 16):
                self.ready = True
        except (OSError, ValueError):
            pass
        return self.ready

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether it can become an agent with `env` and still be found by it."""
        return len(_env_block(env)) <= self.env_room and import_sensitive(env) == import_sensitive(
            self.start_env
        )

    def launch(self, argv: list[str], env: Mapping[str, str], cwd: str, log_path: str) -> bool:
        """Hand it the command; False if it is gone (start a cold agent then)."""
        command = json.dumps({"argv": argv, "env": dict(env), "cwd": cwd, "log": log_path})
        stdin = self.proc.stdin
        try:
            if stdin is None:
                raise ValueError("no command pipe")
            stdin.write(command.encode() + b"\n")
            stdin.flush()
        except (OSError, ValueError):
            self.kill()
            return False
        finally:
            self._close_pipes()
        return True

    def kill(self) -> None:
        self._close_pipes()
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


class WarmAgentPool:
    """Keeps `size` warm processes; `take` hands one out and a replacement starts warming.

    Every process is started from the pool's own thread: a parent-death signal fires
    when the *thread* that forked the child ends, so idle processes die with the pool
    (and with the gateway), and the stdin pipe's EOF says the same. A replacement is
    started once about a core is idle (the ranks of the attempt that just took one are
    busy starting up) or after 20 s at the latest.

    Example:
        >>> pool = WarmAgentPool(2, base_env=lambda: dict(os.environ))  # doctest: +SKIP
        >>> pool.start()  # doctest: +SKIP
        >>> agent = pool.take(env)  # doctest: +SKIP
        >>> agent is None or agent.launch(argv, env, cwd, log_path)  # doctest: +SKIP
        >>> pool.close()  # doctest: +SKIP
    """

    def __init__(self, size: int, base_env: Callable[[], dict[str, str]]) -> None:
        if size < 0:
            raise ValueError(f"a warm pool holds 0 or more processes, not {size}")
        self.size = size
        self._base_env = base_env
        self._idle: list[WarmAgent] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._next_spawn = 0.0
        self._waiting_since: float | None = None
        self._cpu_sample: tuple[int, int] | None = None
        self._idle_looks = 0

    def start(self) -> None:
        """Start warming (idempotent; a closed pool stays closed)."""
        with self._lock:
            if self._thread is not None or self._closed or self.size == 0:
                return
            self._thread = threading.Thread(target=self._run, name="air-warm-pool", daemon=True)
            self._thread.start()

    def take(self, env: Mapping[str, str]) -> WarmAgent | None:
        """A ready process that can serve `env`, the oldest first; None when there is none."""
        with self._lock:
            for agent in self._idle:
                if agent.proc.poll() is None and agent.poll_ready() and agent.fits(env):
                    self._idle.remove(agent)
                    self._idle_looks = 0  # idle time before this launch says nothing now
                    self._wake.set()
                    return agent
        return None

    def num_ready(self) -> int:
        with self._lock:
            return sum(a.proc.poll() is None and a.poll_ready() for a in self._idle)

    def pids(self) -> list[int]:
        """The idle processes' pids (ready or still warming)."""
        with self._lock:
            return [a.pid for a in self._idle]

    def close(self) -> None:
        """Kill every idle process and stop warming. Agents already handed out are not
        the pool's any more: they run their attempt to its end."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            thread = self._thread
        self._wake.set()
        for agent in idle:
            agent.kill()
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)

    # -- the pool's thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                self._reap()
                need = self.size - len(self._idle)
            now = time.monotonic()
            if need > 0 and now >= self._next_spawn:
                if self._waiting_since is None:
                    self._waiting_since = now
                if now - self._waiting_since < _SPARE_CPU_WAIT_S and not self._cpu_to_spare():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                self._waiting_since = None
                try:
                    agent = self._spawn()
                except Exception:  # the thread must outlive a bad spawn
                    log.exception("could not start a warm agent")
                    self._failed()
                else:
                    with self._lock:
                        if self._closed:
                            agent.kill()
                            return
                        self._idle.append(agent)
                continue
            self._wake.wait(0.5)
            self._wake.clear()

    def _cpu_to_spare(self) -> bool:
        """Whether about one core has been idle for the last few looks (/proc/stat)."""
        sample = _cpu_times()
        if sample is None:
            return True
        previous, self._cpu_sample = self._cpu_sample, sample
        if previous is None:
            return False  # no window yet: look again in a moment
        idle, total = sample[0] - previous[0], sample[1] - previous[1]
        if total > 0 and idle / total >= 1.0 / (os.cpu_count() or 1):
            self._idle_looks += 1
        else:
            self._idle_looks = 0
        return self._idle_looks >= _SPARE_CPU_LOOKS

    def _reap(self) -> None:
        """Drop processes that died; back off when they die before getting ready."""
        for agent in list(self._idle):
            if agent.poll_ready():
                self._failures = 0
            if agent.proc.poll() is not None:
                self._idle.remove(agent)
                agent.kill()
                if not agent.ready:
                    self._failed()

    def _failed(self) -> None:
        self._failures += 1
        delay = min(60.0, 2.0**self._failures)
        self._next_spawn = time.monotonic() + delay
        log.warning("a warm agent died before it was ready; the next one in %.0f s", delay)

    def _spawn(self) -> WarmAgent:
        base = self._base_env()
        base.pop(PAD_VAR, None)
        room = min(_MAX_STRING, len(_env_block(base)) + _ENV_SLACK)
        pad = "x" * (room - len(PAD_VAR) - 2)  # "NAME=" + pad + NUL is exactly `room` bytes
        argv = [
            sys.executable,
            "-c",
            _BOOT,
            os.path.abspath(__file__),
            MARKER,
            f"--parent={os.getpid()}",
            "warming",
            " " * _ARGV_ROOM,
        ]
        proc = subprocess.Popen(
            argv,
            env={PAD_VAR: pad, **base},  # the padding first: it is what gets overwritten
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # In the gateway's session until it takes a command: see _IMPORT_NICE.
            start_new_session=False,
        )
        return WarmAgent(proc, base, room)


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) clock ticks of all CPUs since boot; None without /proc."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (ticks[3] + ticks[4], sum(ticks)) if len(ticks) >= 5 else None


# -- the warm process ----------------------------------------------------------------------


def _mm_regions() -> tuple[int, int, int, int] | None:
    """(arg_start, arg_end, env_start, env_end) of this process (Linux 3.5+)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        a0, a1, e0, e1 = (int(fields[n - 3]) for n in (48, 49, 50, 51))
    except (OSError, ValueError, IndexError):
        return None
    return (a0, a1, e0, e1) if 0 < a0 < a1 <= e0 < e1 else None


def _write_argv(mem: int, start: int, end: int, argv: list[str]) -> None:
    """Show `argv` as this process's command line (what fits, whole arguments only)."""
    room = end - start
    out = b""
    for arg in argv:
        item = os.fsencode(arg) + b"\0"
        if len(out) + len(item) > room:
            break
        out += item
    os.pwrite(mem, out.ljust(room, b"\0"), start)


def _show_ready() -> None:
    regions = _mm_regions()
    if regions is None:
        return
    try:
        mem = os.open("/proc/self/mem", os.O_RDWR)
    except OSError:
        return
    try:
        shown = [sys.executable, "-c", "...", MARKER, f"--parent={os.getppid()}", READY_WORD]
        _write_argv(mem, regions[0], regions[1], shown)
    except OSError:
        pass
    finally:
        os.close(mem)


def _take_identity(argv: list[str], env: dict[str, str]) -> bool:
    """Make /proc show `env` and `argv` for this process and adopt `env`; False (and
    nothing changed) when it cannot."""
    regions = _mm_regions()
    pad = os.environ.get(PAD_VAR)
    if regions is None or pad is None:
        return False
    a0, a1, e0, _e1 = regions
    room = len(PAD_VAR) + 1 + len(os.fsencode(pad)) + 1
    block = _env_block(env)
    try:
        mem = os.open("/proc/self/mem", os.O_RDWR)
    except OSError:
        return False
    try:
        if len(block) > room or os.pread(mem, len(PAD_VAR) + 1, e0) != PAD_VAR.encode() + b"=":
            return False
        # C-level environ entries are re-made (setenv copies) before the old bytes go.
        os.environ.clear()
        os.environ.update(env)
        os.pwrite(mem, block.ljust(room, b"\0"), e0)
        _write_argv(mem, a0, a1, argv)
    except OSError:
        return False
    finally:
        os.close(mem)
    return True


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        data += chunk
    return data


def _warm_up() -> None:
    """Import what a torchrun c10d agent imports (measured: these four are all it adds
    after `torch.distributed.run`), at low priority, then say so on stdout."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, _IMPORT_NICE)  # Linux: this thread only
    except OSError:
        pass
    try:
        import encodings.idna  # noqa: F401
        import unicodedata  # noqa: F401

        import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend  # noqa: F401
        import torch.distributed.run  # noqa: F401
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)
    _show_ready()
    try:
        os.write(1, b"R")
    except OSError:
        os._exit(0)  # nobody listens: the pool is gone


def _child_main(args: list[str]) -> None:
    parent = int(next(a for a in args if a.startswith("--parent=")).split("=", 1)[1])
    from air_sdk.runtime.supervise import set_parent_death_signal

    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)
    importer = threading.Thread(target=_warm_up, name="air-warm-import", daemon=True)
    importer.start()
    line = _read_line(0)
    if not line:  # the pool closed the pipe, or its process is gone
        os._exit(0)
    command = json.loads(line)
    # From here on this is a job's agent: a session of its own, and it must outlive the
    # gateway, as cold ones do.
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (started so by someone else)
    set_parent_death_signal(0)
    argv: list[str] = command["argv"]
    env: dict[str, str] = command["env"]
    logfd = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    os.close(logfd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(command["cwd"])
    if importer.is_alive() or argv[1:3] not in _AGENTS or not _take_identity(argv, env):
        os.execve(argv[0], argv, env)  # a cold start, in this very process
    import torch.distributed.run as run

    from air_sdk._agent import tune_rendezvous

    tune_rendezvous()  # as `python -m air_sdk._agent` does
    # As `python -m torch.distributed.run` would have it.
    sys.path[0:0] = [os.getcwd()]
    sys.argv = [str(run.__file__), *argv[3:]]
    run.main()


if __name__ == "__main__":
    _child_main(sys.argv[1:])
