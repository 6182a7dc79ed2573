"""NodeRunner: starts one node's ranks, watches them, reports how they ended, stops them.

The same class runs on every backend: inside a process of its own per job and
virtual node on the local backend (`air_sdk.runner.node.process`), inside each
node's actor on Ray. For each attempt it

* starts every local rank as `python -u SCRIPT ARGS` in a session of its own, with
  the environment the runner planned (`NodeLaunch`: torchrun's variables and
  AIR's, from `air_sdk.schema.WorkerEnv`) over the node's allowed environment;
  each rank dies with its NodeRunner (a parent-death signal), and the NodeRunner is
  the subreaper of everything below it, so nothing a rank starts escapes it;
* copies each rank's output, prefixed `[rank N] `, to the node's log, keeps its
  last 50 lines and ships them to the gateway with the rank's heartbeats;
* when a rank ends writes its exit record (`exits/rank-N.json`: exit code or
  signal, OOM kill, last lines) and reports it to the gateway;
* on `stop` sends SIGTERM to every rank's process group, SIGKILL after the grace
  to every process left below it, and returns once they are gone;
* keeps warm interpreters (`_warm.py`): processes that already imported torch,
  started once a core is idle, that become the next attempt's ranks.

It knows pids it started, never scans the host.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from air_sdk.runner.node import _procs
from air_sdk.runner.node._warm import WarmPool
from air_sdk.runner.node.launch import NodeLaunch, RankLaunch
from air_sdk.runner.node.limits import LimitWatch, explain_exit, rlimit_arg
from air_sdk.runner.node.records import RankRecord, failure_marks, log_tail, open_node_log
from air_sdk.runner.node.reporter import RankReporter
from air_sdk.runner.node.sandbox import sandboxed_returncode, wrap
from air_sdk.runtime._flight_recorder import trace_env
from air_sdk.runtime.supervise import drain_output

__all__ = ["NodeRunner"]

log = logging.getLogger(__name__)

TAIL_LINES = 50
#: after a rank exits, how long its output may still drain (a child of the rank may
#: hold the pipe open) before its exit record is written
DRAIN_AFTER_EXIT_S = 2.0
#: how long a stop waits for killed processes to finish exiting (a process in
#: uninterruptible I/O, e.g. on a hung network filesystem, can outlast any wait)
TEARDOWN_WAIT_S = 30.0
#: the node thread's longest sleep; a child's exit or a request wakes it at once
_TICK_S = 0.25


@dataclass
class _Rank:
    node: NodeLaunch
    launch: RankLaunch
    #: None when it could not be started (it counts as exited with code 127)
    proc: subprocess.Popen[bytes] | None
    warm: bool
    created: float | None
    oom_before: int | None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    tail_lock: threading.Lock = field(default_factory=threading.Lock)
    returncode: int | None = None
    ended_at: float | None = None
    pump: threading.Thread | None = None
    #: set while the pump waits on the pipe with every line read so far handled
    pump_idle: threading.Event = field(default_factory=threading.Event)
    recorded: threading.Event = field(default_factory=threading.Event)
    reporter: RankReporter | None = None
    #: the job's limit it was killed for, or that its end shows it hit (`node.limits`)
    limit: str | None = None

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0


class NodeRunner:
    """One node's ranks of a job, attempt after attempt.

    `base_env` is what ranks start from (already allowed: `air_sdk.runner.node.env`);
    `on_change` is called (from any of its threads) when a rank started or ended;
    `python_path` goes first on every rank's PYTHONPATH.

    Example:
        >>> runner = NodeRunner(base_env=allowed_env(os.environ))  # doctest: +SKIP
        >>> runner.start(launch)  # doctest: +SKIP
        {0: 4242, 1: 4243}
        >>> runner.wait(timeout_s=60)  # doctest: +SKIP
        (0, 'every rank exited 0')
        >>> runner.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        base_env: dict[str, str],
        warm: bool = True,
        on_change: Callable[[], None] | None = None,
        python_path: list[str] | None = None,
    ) -> None:
        self.base_env = dict(base_env)
        self._on_change = on_change or (lambda: None)
        self._python_path = list(python_path or [])
        self._changed = threading.Condition()
        self._launch: NodeLaunch | None = None
        self._ranks: list[_Rank] = []
        self._stopping = False
        self._log: IO[bytes] | None = None
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._closed = False
        # children we did not start (a Ray worker's own), never touched
        self._foreign = set(_procs.descendants(os.getpid()))
        _procs.set_child_subreaper()
        self.warm_pool = WarmPool(enabled=warm and hasattr(os, "fork"))
        self._thread = threading.Thread(target=self._loop, name="air-node", daemon=True)
        self._thread.start()

    # -- the attempt -------------------------------------------------------------------------

    def start(self, launch: NodeLaunch, master: tuple[str, int] | None = None) -> dict[int, int]:
        """Start every rank of `launch` (`master`: MASTER_ADDR/PORT when the plan left
        them open); returns {rank: pid}. A running attempt must be stopped first."""
        with self._changed:
            if any(r.returncode is None for r in self._ranks):
                raise RuntimeError("the node still runs an attempt: stop it first")
            self._close_log()
            self._log = open_node_log(launch.attempt_dir, launch.log_path)
            self._launch = launch
            self._ranks = []
            self._stopping = False
        envs = [self._rank_env(launch, r, master) for r in launch.ranks]
        ranks = self._call(lambda: self._spawn_all(launch, envs))
        if launch.limits.any:

            def done() -> bool:
                return self._launch is not launch or all(r.returncode is not None for r in ranks)

            over = functools.partial(self._over_limit, ranks)
            LimitWatch(launch.limits, launch.node, self._tree, over, done=done).start()
        warm = sum(r.warm for r in ranks)
        first, last = launch.ranks[0].rank, launch.ranks[-1].rank
        self.note(
            f"attempt {launch.attempt}: started ranks {first}..{last}"
            f" ({warm} of {len(ranks)} on warm interpreters)"
        )
        self._on_change()
        return {r.rank: r.pid for r in ranks}

    def verdict(self) -> tuple[int, str] | None:
        """(exit status, what happened) once a rank failed or every rank ended; else None.
        A rank killed by a signal counts as 128 + its number."""
        with self._changed:
            return self._verdict()

    def wait(self, timeout_s: float | None = None) -> tuple[int | None, str]:
        """Block until `verdict()` has one; (None, "") if `timeout_s` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while True:
                verdict = self._verdict()
                if verdict is not None:
                    return verdict
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None, ""
                self._changed.wait(left)

    def stop(self, grace_s: float) -> None:
        """SIGTERM every rank's process group, SIGKILL whatever is left below this
        NodeRunner after `grace_s` (warm interpreters aside), and return once the
        ranks are gone and their exit records written."""
        with self._changed:
            self._stopping = True
            live = [r for r in self._ranks if r.returncode is None]
            self._changed.notify_all()
        for r in live:
            self._signal_rank(r, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with self._changed:
            while any(r.returncode is None for r in self._ranks):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.05))
        for _ in range(3):
            targets = self._tree()
            if not targets and all(r.returncode is not None for r in self._ranks):
                break
            for r in self._ranks:
                if r.pid:
                    _procs.killpg(r.pid, signal.SIGKILL)
            for pid in targets:
                _procs.kill(pid, signal.SIGKILL)
            with self._changed:
                self._changed.wait_for(
                    lambda: all(r.returncode is not None for r in self._ranks), timeout=5
                )
            self._call(self._reap_orphans)
        self._wait_torn_down()
        for r in self._ranks:
            r.recorded.wait(DRAIN_AFTER_EXIT_S + 1)
        self._on_change()

    def _over_limit(self, ranks: list[_Rank], reason: str) -> None:
        """The attempt's processes went past a limit: say which, and kill them all (the
        runner sees the ranks' ends, each naming the limit, and stops the attempt)."""
        with self._changed:
            for r in ranks:
                r.limit = r.limit or reason
        self.note(reason)
        for _ in range(3):  # a fork bomb forks while it is killed
            for r in ranks:
                if r.pid and r.returncode is None:
                    _procs.killpg(r.pid, signal.SIGKILL)
            for pid in self._tree():
                _procs.kill(pid, signal.SIGKILL)

    def _wait_torn_down(self) -> None:
        """Wait until what was killed has finished exiting. A SIGKILLed process is
        "dying" while the kernel tears it down, and it holds its memory, files and devices
        until then (measured: 4 of 6 stops of ranks whose children held 800 MB returned
        with a child still torn down); a stop that returned must have freed them."""
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while self._tree(include_dying=True) and time.monotonic() < deadline:
            self._call(self._reap_orphans)
            time.sleep(0.01)

    def close(self, grace_s: float = 0.5) -> None:
        """Stop the attempt, kill the warm interpreters, end the node thread."""
        self.stop(grace_s)
        self._call(self.warm_pool.close)
        self._closed = True
        self._wake()
        self._thread.join(5)
        self._close_log()

    # -- what the runner asks ------------------------------------------------------------------

    @property
    def launch(self) -> NodeLaunch | None:
        return self._launch

    def ranks(self) -> list[RankRecord]:
        """The current attempt's ranks: pid, start time, exit code once reaped."""
        with self._changed:
            return [
                RankRecord(
                    rank=r.rank,
                    local_rank=r.launch.local_rank,
                    pid=r.pid,
                    create_time=r.created,
                    returncode=r.returncode,
                    warm=r.warm,
                )
                for r in self._ranks
            ]

    def stacks(self) -> dict[int, str]:
        """Every live rank's Python stack, by rank (py-spy)."""
        with self._changed:
            live = {r.rank: r.pid for r in self._ranks if r.returncode is None}
        return _procs.dump_stacks(live)

    def failure_marks(self) -> list[str]:
        """The files this node's ranks left under `ATTEMPT_DIR/failure-saves/`."""
        launch = self._launch
        return failure_marks(Path(launch.attempt_dir)) if launch else []

    def log_tail(self, num_lines: int = 20) -> list[str]:
        """The last lines of this attempt's node log (the ranks' output and ours)."""
        launch = self._launch
        return log_tail(Path(launch.log_path), num_lines) if launch else []

    def note(self, line: str) -> None:
        """Add a line of our own to the node's log."""
        launch, out = self._launch, self._log
        if launch is None or out is None:
            return
        try:
            out.write(f"[air node {launch.node}] {line}\n".encode())
            out.flush()
        except (OSError, ValueError):
            pass

    # -- starting ranks (the node thread) -----------------------------------------------------

    def _rank_env(
        self, launch: NodeLaunch, rank: RankLaunch, master: tuple[str, int] | None
    ) -> dict[str, str]:
        env = dict(self.base_env)
        for name, value in launch.defaults.items():
            env.setdefault(name, value)
        env.update(rank.env)
        if master is not None:
            from air_sdk.schema.worker_env import WorkerEnv

            env[WorkerEnv.env_name("master_addr")] = master[0]
            env[WorkerEnv.env_name("master_port")] = str(master[1])
        if self._python_path:
            rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            env["PYTHONPATH"] = os.pathsep.join([*self._python_path, *rest])
        # torch's flight recorder for GPU jobs, so a hang can name its rank
        env.update(trace_env(env))
        return env

    def _spawn_all(self, launch: NodeLaunch, envs: list[dict[str, str]]) -> list[_Rank]:
        started = []
        for rank, env in zip(launch.ranks, envs, strict=True):
            proc = self.warm_pool.take_and_hand_over(launch, env)
            warm = proc is not None
            error = None
            if proc is None:
                parent = 0 if launch.wrapper else os.getpid()  # a sandbox forks
                rlimits = launch.limits.rlimits(user_namespace=bool(launch.wrapper))
                argv = _procs.cold_argv([], launch.command, parent, env, rlimit_arg(rlimits))
                env_fd = None
                try:
                    # the sandbox's wrapper starts with an empty environment; the
                    # rank's own reaches the rank only (`sandbox.wrap`)
                    argv, wrapper_env, env_fd = wrap(launch.wrapper, argv, env)
                    proc = subprocess.Popen(
                        argv,
                        cwd=launch.cwd,
                        env=wrapper_env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        pass_fds=() if env_fd is None else (env_fd,),
                        start_new_session=True,
                    )
                except OSError as exc:
                    error = f"air: could not start rank {rank.rank}: {exc}"
                finally:
                    if env_fd is not None:
                        os.close(env_fd)
            created = _procs.create_time(proc.pid) if proc is not None else None
            r = _Rank(launch, rank, proc, warm, created, None)
            if error is not None:  # reported like any rank that failed at once
                r.tail.append(error)
                r.returncode, r.ended_at = 127, time.time()
            r.reporter = RankReporter(env, launch.node, rank.local_rank == 0, pid=r.pid)
            r.pump = threading.Thread(
                target=self._pump, args=(r,), name=f"air-rank-{rank.rank}", daemon=True
            )
            started.append(r)
        # Only now what reporting needs (pydantic among it): the ranks are on their way.
        from air_sdk.runtime.supervise import oom_kill_count

        oom_before = oom_kill_count()  # an OOM kill from now on is one of ours
        with self._changed:
            for r in started:
                r.oom_before = oom_before
            self._ranks = started
            self._changed.notify_all()
        for r in started:
            assert r.pump is not None
            r.pump.start()
            if r.proc is None:
                threading.Thread(target=self._finish, args=(r,), daemon=True).start()
        self.warm_pool.plan(launch, envs[0])  # the next attempt's, once a core is idle
        return started

    def _pump(self, r: _Rank) -> None:
        from air_sdk.runtime.supervise import pump_output

        assert r.reporter is not None
        threading.Thread(target=r.reporter.start, name=f"air-report-{r.rank}", daemon=True).start()
        if r.proc is not None and r.proc.stdout is not None:
            pump_output(
                r.proc.stdout, r.rank, r.tail, r.tail_lock, r.reporter, self._log, r.pump_idle
            )

    # -- the node thread: forks, reaps, keeps warm interpreters --------------------------------

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the node thread (a parent-death signal fires when the *thread*
        that forked a child ends: every child is forked by this one long-lived thread)."""
        if threading.current_thread() is self._thread:
            return fn()
        future: Future[Any] = Future()
        self._requests.put((fn, future))
        self._wake()
        return future.result()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _loop(self) -> None:
        # Children inherit the forking thread's signal mask: a rank must get SIGTERM
        # (the thread that created this one may block signals, as Ray's do).
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
        next_orphan_reap = 0.0
        while not self._closed:
            while True:
                try:
                    fn, future = self._requests.get_nowait()
                except queue.Empty:
                    break
                try:
                    future.set_result(fn())
                except BaseException as exc:  # the caller gets it; this thread lives on
                    future.set_exception(exc)
            try:
                self._reap_ranks()
                self.warm_pool.tend()
                now = time.monotonic()
                if now >= next_orphan_reap:
                    self._reap_orphans()
                    next_orphan_reap = now + 1.0
            except Exception:  # the ranks' parent-death signals hang on this thread
                log.exception("node thread")
            self._sleep()
        for fn, future in iter(lambda: _next(self._requests), None):
            future.set_result(fn())

    def _sleep(self) -> None:
        fds = [self._wake_r]
        waiters = [r for r in self._ranks if r.returncode is None and r.proc is not None]
        pidfds = []
        for r in waiters:
            try:
                pidfds.append(os.pidfd_open(r.pid))
            except (OSError, AttributeError):
                pidfds = []
                break
        try:
            timeout = _TICK_S if pidfds or not waiters else 0.02
            select.select(fds + pidfds, [], [], timeout)
        finally:
            for fd in pidfds:
                os.close(fd)
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _reap_ranks(self) -> None:
        ended = []
        with self._changed:
            for r in self._ranks:
                if r.returncode is None and r.proc is not None and r.proc.poll() is not None:
                    r.returncode = sandboxed_returncode(r.proc.returncode, r.node.wrapper)
                    r.ended_at = time.time()
                    ended.append(r)
            if ended:
                self._changed.notify_all()
        for r in ended:
            threading.Thread(
                target=self._finish, args=(r,), name=f"air-exit-{r.rank}", daemon=True
            ).start()
        if ended:
            self._on_change()

    def _reap_orphans(self) -> None:
        """Reap processes a rank left behind that ended (they became our children)."""
        ours = {r.pid for r in self._ranks} | set(self.warm_pool.pids()) | self._foreign
        for pid in _procs._children(os.getpid()):
            if pid in ours:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def _tree(self, *, include_dying: bool = False) -> list[int]:
        """Every live process of the attempt: the ranks, what is below them, and what
        they left behind (re-parented to us); warm interpreters aside. With
        `include_dying`, also those still exiting (killed, not yet torn down)."""
        keep = set(self.warm_pool.pids()) | self._foreign | {os.getpid()}
        found: list[int] = []
        for r in self._ranks:
            if r.returncode is None:
                found.append(r.pid)
                found += _procs.descendants(r.pid)
        for pid in _procs._children(os.getpid()):
            if pid not in keep and all(pid != r.pid for r in self._ranks):
                found.append(pid)
                found += _procs.descendants(pid)
        running = (lambda p: not _procs.exited(p)) if include_dying else _procs.alive
        return [p for p in dict.fromkeys(found) if p not in keep and running(p)]

    def _signal_rank(self, r: _Rank, sig: int) -> None:
        if not r.pid:
            return
        if r.node.wrapper:
            # The rank's own process group, inside its sandbox: a signal to the sandbox's
            # process would end it, and its namespace with every process in it, at once.
            target = _procs.payload(r.pid)
            try:
                _procs.killpg(os.getpgid(target), sig)
            except OSError:
                pass
            return
        try:
            leader = os.getpgid(r.pid) == r.pid
        except OSError:
            return
        if leader:
            _procs.killpg(r.pid, sig)
        else:  # a warm interpreter in the instant before its setsid()
            _procs.kill(r.pid, sig)

    # -- a rank's end -----------------------------------------------------------------------

    def _finish(self, r: _Rank) -> None:
        from air_sdk.runtime.supervise import rank_exit, write_exit_record

        launch = r.node  # its own attempt's, even if the next one started meanwhile
        assert r.returncode is not None
        if r.pump is not None and r.proc is not None and r.proc.stdout is not None:
            drain_output(r.pump, r.proc.stdout, r.pump_idle, DRAIN_AFTER_EXIT_S)
        with r.tail_lock:
            tail = list(r.tail)
        ended = rank_exit(r.rank, r.returncode, tail, r.oom_before, launch.node)
        nproc = "NPROC" in launch.limits.rlimits(user_namespace=bool(launch.wrapper))
        r.limit = r.limit or explain_exit(launch.limits, r.rank, r.returncode, tail, nproc=nproc)
        ended = ended.model_copy(update={"ended_at": r.ended_at, "limit": r.limit})
        write_exit_record(ended, launch.attempt_dir)  # first: the runner reads it at once
        with self._changed:  # only now does the node's verdict count this rank
            r.recorded.set()
            self._changed.notify_all()
        self._on_change()
        if r.reporter is not None:
            r.reporter.finish(ended)

    def _verdict(self) -> tuple[int, str] | None:
        # a rank counts once its exit record is written: a runner that reads the
        # verdict finds the record of the rank it names
        failed = sorted(
            (r.ended_at or 0.0, r.rank, r.returncode, r.limit or "")
            for r in self._ranks
            if r.returncode not in (None, 0) and r.recorded.is_set()
        )
        if failed:
            _, rank, code, limit = failed[0]
            assert code is not None
            status = 128 - code if code < 0 else code
            return status, limit or f"rank {rank} {_describe(status)}"
        if self._ranks and all(r.returncode == 0 and r.recorded.is_set() for r in self._ranks):
            return 0, "every rank exited 0"
        if self._stopping and not self._ranks:
            return 143, "stopped before its ranks started"
        return None

    def _close_log(self) -> None:
        if self._log is not None:
            try:
                self._log.close()
            except OSError:
                pass
            self._log = None


def _describe(status: int) -> str:
    if status > 128:
        return f"was killed by {_procs.signal_name(status - 128)}"
    return f"exited with code {status}"


def _next(q: queue.SimpleQueue[Any]) -> Any:
    try:
        return q.get_nowait()
    except queue.Empty:
        return None
