"""Warm interpreters: a NodeRunner's pre-imported Pythons for the job's next attempt.

A rank's start is mostly a fresh interpreter importing torch (and, at its first
`DistributedDataParallel(...)`, `torch._dynamo`): 2-3 s here, paid again by every
restart, and as much again by torchrun's restarts, which start fresh workers too.
While an attempt runs, its NodeRunner starts one interpreter per local rank that
does those imports ahead of time (`_boot.py`) and waits; the next attempt's ranks
take them over instead of starting cold.

They are the job's own processes: started with the job's environment (less what
changes per attempt), in the job's code directory, behind the same wrapper as its
ranks (the job's sandbox, `sandbox.py`), children of the job's NodeRunner that die with it.
One starts only once the attempt has run 10 s (its ranks are past their start-up)
and about a core has been idle for a moment (or 20 s later), at low priority and in
the NodeRunner's session (with autogroup scheduling a session
of its own would take a share of the CPU equal to a rank's), so it does not slow
the ranks that are starting up or training. A rank whose import-shaping
environment (`launch.import_sensitive`) differs from a warm interpreter's starts
cold.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from air_sdk.runner.node import _boot, _procs
from air_sdk.runner.node.launch import NodeLaunch, import_sensitive
from air_sdk.runner.node.limits import rlimit_arg
from air_sdk.runner.node.sandbox import wrap

__all__ = ["WarmPool"]

log = logging.getLogger(__name__)

#: no warm-up in an attempt's first seconds: its ranks are starting (imports, process
#: group, model) and one beside them slows exactly what a launch waits for (measured
#: here, benchmarks/launch.py: 0.573x torchrun with warm-ups that could begin at once,
#: DDP() 6.9 s; 0.659x with this delay, DDP() 3.2 s; the load differed, 7-11 vs 3-6)
START_DELAY_S = 10.0
#: then start warming once about a core is idle, but never wait longer than this
SPARE_CPU_WAIT_S = 20.0
#: how often the idle-CPU check looks
_LOOK_S = 0.5

_Key = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]


def _key(launch: NodeLaunch, env: dict[str, str]) -> _Key:
    per_attempt = set(launch.attempt_env)
    shaping = import_sensitive({k: v for k, v in env.items() if k not in per_attempt})
    return (launch.cwd, tuple(launch.wrapper), tuple(sorted(shaping.items())))


@dataclass
class _Interpreter:
    proc: subprocess.Popen[bytes]
    status_fd: int
    key: _Key
    ready: bool = False

    def poll_ready(self) -> bool:
        if not self.ready:
            try:
                if b"R" in os.read(self.status_fd, 16):
                    self.ready = True
            except (BlockingIOError, OSError):
                pass
        return self.ready

    def kill(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            os.close(self.status_fd)
        except OSError:
            pass
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass


@dataclass(frozen=True)
class _Want:
    key: _Key
    count: int
    #: the job's sandbox (`sandbox.wrap` puts `env` behind it), [] for none
    wrapper: list[str]
    argv: list[str]
    cwd: str
    env: dict[str, str]


class WarmPool:
    """The warm interpreters of one NodeRunner. Every method but `pids` and
    `num_ready` runs on the NodeRunner's node thread (it forks them).

    Example:
        >>> pool = WarmPool(enabled=False)
        >>> pool.num_ready()
        0
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._idle: list[_Interpreter] = []
        self._lock = threading.Lock()
        self._want: _Want | None = None
        self._cpu = _procs.IdleCpu()
        self._waiting_since: float | None = None
        self._next_look = 0.0
        self._failures = 0
        self._next_spawn = 0.0

    def plan(self, launch: NodeLaunch, env: dict[str, str]) -> None:
        """Keep one interpreter per rank of `launch` ready for the job's next attempt
        (`env`: a rank's whole environment); drop ones that could not serve it."""
        if not (self.enabled and launch.warm and launch.ranks):
            self._want = None
            self.close()
            return
        per_attempt = set(launch.attempt_env)
        key = _key(launch, env)
        parent = 0 if launch.wrapper else os.getpid()  # a wrapper may stand in between
        self._want = _Want(
            key=key,
            count=launch.ranks_per_node,
            wrapper=list(launch.wrapper),
            argv=[
                sys.executable,
                "-u",
                "-c",
                _boot.BOOT,
                str(Path(_boot.__file__).resolve()),
                _boot.MARKER,
                f"--parent={parent}",
                "--status-fd={fd}",
                *launch.warm_imports,
            ],
            cwd=launch.cwd,
            env={k: v for k, v in env.items() if k not in per_attempt},
        )
        with self._lock:
            stale = [w for w in self._idle if w.key != key]
            self._idle = [w for w in self._idle if w.key == key]
        for w in stale:
            w.kill()
        self._cpu.reset()
        self._waiting_since = None
        self._next_spawn = max(self._next_spawn, time.monotonic() + START_DELAY_S)

    def take_and_hand_over(
        self, launch: NodeLaunch, env: dict[str, str]
    ) -> subprocess.Popen[bytes] | None:
        """A ready interpreter that becomes the rank `env` describes (its process,
        whose stdout is the rank's output); None when none fits."""
        key = _key(launch, env)
        while True:
            with self._lock:
                found = next(
                    (
                        w
                        for w in self._idle
                        if w.key == key and w.proc.poll() is None and w.poll_ready()
                    ),
                    None,
                )
                if found is not None:
                    self._idle.remove(found)
            if found is None:
                return None
            rlimits = rlimit_arg(launch.limits.rlimits(user_namespace=bool(launch.wrapper)))
            command = {"argv": launch.command, "env": env, "cwd": launch.cwd, "rlimits": rlimits}
            try:
                assert found.proc.stdin is not None
                found.proc.stdin.write(json.dumps(command).encode() + b"\n")
                found.proc.stdin.close()
            except (OSError, ValueError, AssertionError):
                found.kill()
                continue
            os.close(found.status_fd)
            self._cpu.reset()  # the idle time before this launch says nothing now
            return found.proc

    def tend(self) -> None:
        """Drop interpreters that died; start one more when one is missing and a core
        is free (called by the node thread every tick)."""
        with self._lock:
            for w in list(self._idle):
                ready_before = w.ready
                if w.proc.poll() is None:
                    if w.poll_ready() and not ready_before:
                        self._failures = 0
                    continue
                self._idle.remove(w)
                w.kill()
                if not w.ready:
                    self._failed()
            want = self._want
            have = sum(w.key == want.key for w in self._idle) if want else 0
        now = time.monotonic()
        if want is None or have >= want.count or now < self._next_spawn:
            return
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since < SPARE_CPU_WAIT_S:
            if now < self._next_look:
                return
            self._next_look = now + _LOOK_S
            if not self._cpu.spare():
                return
        self._waiting_since = None
        try:
            interpreter = self._spawn(want)
        except OSError as exc:
            log.warning("could not start a warm interpreter: %s", exc)
            self._failed()
            return
        with self._lock:
            self._idle.append(interpreter)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._idle]

    def num_ready(self) -> int:
        with self._lock:
            return sum(w.ready for w in self._idle)

    def close(self) -> None:
        """Kill every idle interpreter."""
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()

    def _spawn(self, want: _Want) -> _Interpreter:
        status_r, status_w = os.pipe()
        env_fd = None
        try:
            argv = [a.replace("{fd}", str(status_w)) for a in want.argv]
            argv, env, env_fd = wrap(want.wrapper, argv, want.env)
            proc = subprocess.Popen(
                argv,
                cwd=want.cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(status_w,) if env_fd is None else (status_w, env_fd),
                # in our session while it warms up: see the module docstring
                start_new_session=False,
            )
        except OSError:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
            if env_fd is not None:
                os.close(env_fd)
        os.set_blocking(status_r, False)
        return _Interpreter(proc, status_r, want.key)

    def _failed(self) -> None:
        self._failures += 1
        delay = min(60.0, 2.0**self._failures)
        self._next_spawn = time.monotonic() + delay
        log.warning("a warm interpreter died before it was ready; the next one in %.0f s", delay)
