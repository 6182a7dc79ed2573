"""The rank supervisor: torchrun's worker entrypoint, wrapped around the user's script.

    python -m torch.distributed.run ... -m air_sdk.runtime.supervise [--] SCRIPT [ARGS...]
    python -m air_sdk.runtime.supervise -m MODULE [ARGS...]

For launchers AIR does not run itself (a Kubeflow TrainJob's torchrun, see
`air_sdk.render.k8s`). It runs `python -u SCRIPT ARGS...` as its child with the same
env, prefixes each output line with `[rank N] `, ships the lines to the gateway,
forwards SIGTERM and SIGINT, and when the child ends reports a `RankExit` (exit
code or signal, OOM kill, the last 50 lines) to the gateway and to
`$AIR_ATTEMPT_DIR/exits/rank-N.json`, then exits with the child's code (128 +
signal number for a signal death). Parent-death signals tie the generations
together: if the launcher dies the supervisor dies, and if the supervisor dies its
child dies.

AIR's own backends start ranks with a NodeRunner (`air_sdk.runner.node`), which
supervises every rank of its node itself with the same functions: `pump_output`,
`rank_exit`, `write_exit_record`, `oom_kill_count`.

It never imports torch.
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from air_sdk.errors import ConfigError
from air_sdk.runtime._context import context
from air_sdk.runtime._flight_recorder import trace_env
from air_sdk.runtime._rank_main import python_argv

if TYPE_CHECKING:
    from air_sdk.schema.events import RankExit

# The same limit as air_sdk.schema.events.MAX_LOG_LINE_CHARS (a test keeps them equal);
# not imported from there: the events module is loaded only once a rank has started.
MAX_LOG_LINE_CHARS = 16_384

__all__ = [
    "TAIL_LINES",
    "main",
    "oom_kill_count",
    "pump_output",
    "rank_exit",
    "sample_interval_s",
    "set_parent_death_signal",
    "write_exit_record",
]

TAIL_LINES = 50
_FORWARDED = {signal.SIGTERM, signal.SIGINT}
_PR_SET_PDEATHSIG = 1
_SI_KERNEL = 0x80  # Linux si_code of a signal the kernel sent, e.g. Ctrl-C to a terminal's group
_READ_LIMIT = 4 * MAX_LOG_LINE_CHARS  # bytes: enough for the longest line we keep, in any UTF-8
_DRAIN_AFTER_EXIT_S = 2.0  # a grandchild may hold the pipe open after the child exits
_FINAL_FLUSH_S = 5.0
_USAGE = "usage: python -m air_sdk.runtime.supervise [--] SCRIPT [ARGS...] | -m MODULE [ARGS...]"

_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Have Linux send `sig` to this process when its parent dies; False where unsupported.

    Example:
        >>> set_parent_death_signal()  # doctest: +SKIP
        True
    """
    return _prctl is not None and _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def _child_preexec(parent_pid: int, unblock: bool) -> Callable[[], None]:
    # Runs in the forked child before exec; only the main thread exists then.
    def setup() -> None:
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        set_parent_death_signal()
        if os.getppid() != parent_pid:  # the supervisor died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


class _SignalForwarder:
    """Forwards SIGTERM and SIGINT to the child, unless the child got that signal itself.

    The child shares the supervisor's process group, so a signal sent to the group
    (the torchrun agent's `killpg`, Ctrl-C in a terminal) already reached it, and
    forwarding would deliver it twice (a user's SIGTERM handler would run twice).
    On Linux `sigwaitinfo` tells who sent a signal; elsewhere every signal is forwarded.
    """

    def __init__(self) -> None:
        self.uses_mask = hasattr(signal, "sigwaitinfo") and hasattr(signal, "pthread_sigmask")
        self._child: subprocess.Popen[bytes] | None = None
        self._early: list[int] = []

    def install(self) -> None:
        """Call before any thread or child exists: both inherit the signal mask."""
        if self.uses_mask:
            signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
        else:
            for signum in _FORWARDED:
                signal.signal(signum, self._on_signal)

    def start(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child
        for signum in self._early:
            self._forward(signum)
        if self.uses_mask:  # signals that came in before now are still pending
            threading.Thread(target=self._wait_loop, name="air-signals", daemon=True).start()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._child is None:
            self._early.append(signum)
        else:
            self._forward(signum)

    def _wait_loop(self) -> None:
        while True:
            info = signal.sigwaitinfo(_FORWARDED)
            if not _reached_child_directly(info):
                self._forward(info.si_signo)

    def _forward(self, signum: int) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)


def _run_id_name() -> str:
    from air_sdk.schema.worker_env import WorkerEnv  # only once a signal came

    return WorkerEnv.env_name("run_id")


def _reached_child_directly(info: Any) -> bool:
    if info.si_code == _SI_KERNEL:  # terminal signals go to the whole foreground group
        return True
    # A torchelastic agent starts each worker in a new session and stops it with killpg.
    return (
        _run_id_name() in os.environ and info.si_pid == os.getppid() and os.getpgrp() == os.getpid()
    )


class LineSink(Protocol):
    """Where output lines go besides the log: a `MetricsShipper`, or anything with its
    `add_line`."""

    def add_line(self, line: str) -> None: ...


def pump_output(
    stream: IO[bytes],
    rank: int,
    tail: deque[str],
    tail_lock: threading.Lock,
    shipper: LineSink,
    out: IO[bytes] | None = None,
    idle: threading.Event | None = None,
) -> None:
    """Copy a rank's output line by line: prefixed `[rank N] ` to `out` (default: this
    process's stdout), into `tail` and to the gateway, without torch's own `[rankN]: `.
    Returns at EOF. `idle`, when given, is set while every line read so far was
    handled and the pump waits on the pipe (what a rank's exit waits for, so its last
    lines are never cut off).

    Example:
        >>> pump_output(io.BytesIO(b"hi\\n"), 0, deque(), threading.Lock(), shipper)  # doctest: +SKIP
    """
    prefix = f"[rank {rank}] "
    # torch.distributed's excepthook writes each traceback line as "[rank0]: ..."; the
    # line already says its rank once (ours), so theirs goes
    torch_prefix = f"[rank{rank}]: "
    if out is None:
        out = getattr(sys.stdout, "buffer", None)
    if idle is not None and isinstance(stream, io.BufferedReader):
        # lines already read from the pipe but not yet handled are in the buffer:
        # `idle` is set only while the pump waits on the pipe with none left
        # (the same pipe: the reader it came in stays unread, so its fileno still tells)
        stream = io.BufferedReader(_IdleWhileReading(stream.raw, idle))
    cut = False  # inside an over-long line whose kept part was already handled
    while raw := stream.readline(_READ_LIMIT):
        complete = raw.endswith(b"\n")
        if cut:
            cut = not complete
            continue
        cut = not complete and len(raw) >= _READ_LIMIT
        line = raw.decode("utf-8", errors="replace").rstrip("\n").removesuffix("\r")
        line = line.removeprefix(torch_prefix)[:MAX_LOG_LINE_CHARS]
        with tail_lock:
            tail.append(line)
        shipper.add_line(line)
        if out is not None:
            try:
                out.write((prefix + line + "\n").encode("utf-8", errors="replace"))
                out.flush()
            except (OSError, ValueError):  # our stdout went away; keep shipping
                out = None


def drain_output(
    pump: threading.Thread, stream: IO[bytes], idle: threading.Event, timeout_s: float
) -> None:
    """Wait until `pump_output` has handled what a rank wrote before it ended: its EOF,
    or (a child of the rank may hold the pipe open) an empty pipe with every line read
    handled (`idle`); at most `timeout_s`. The exit record then holds the last lines,
    a traceback's too."""
    deadline = time.monotonic() + timeout_s
    while pump.is_alive() and time.monotonic() < deadline:
        pending = _pending(stream.fileno())  # -1, cannot tell: wait for the EOF
        pump.join(0.05)  # the pump turns what it read into lines meanwhile
        # under load the pump can still hold lines it read: those were lost at exit
        if pending == 0 and idle.is_set():
            return


class _IdleWhileReading(io.RawIOBase):
    """A pipe that says when its reader is blocked on it (between two reads the
    buffered reader above it is handling what it got)."""

    def __init__(self, raw: Any, idle: threading.Event) -> None:
        self._raw, self._idle = raw, idle

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def readinto(self, buffer: Any) -> int | None:
        if _pending(self.fileno()) == 0:  # this read will wait: all before it was handled
            self._idle.set()
        try:
            return int(self._raw.readinto(buffer))
        finally:
            self._idle.clear()


def _pending(fd: int) -> int:
    """Bytes waiting in a pipe (-1 when it cannot tell)."""
    import fcntl
    import termios

    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little")
    except (OSError, ValueError):
        return -1


def oom_kill_count() -> int | None:
    """The cgroup's `oom_kill` counter (v2 memory.events, v1 memory.oom_control), if readable."""
    try:
        entries = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    root = Path("/sys/fs/cgroup")
    candidates: list[Path] = []
    for entry in entries:
        hierarchy, controllers, path = entry.split(":", 2)
        relative = path.lstrip("/")
        if hierarchy == "0" and not controllers:
            candidates.append(root / relative / "memory.events")
        elif "memory" in controllers.split(","):
            candidates.append(root / "memory" / relative / "memory.oom_control")
    for candidate in candidates:
        try:
            for line in candidate.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def rank_exit(
    rank: int, returncode: int, tail: list[str], oom_before: int | None, node: str | None = None
) -> RankExit:
    """How a rank ended (`returncode` as Popen gives it: negative for a signal), with an
    OOM kill told apart from another SIGKILL by the cgroup's counter."""
    from air_sdk.schema.events import RankExit

    if returncode >= 0:
        return RankExit(rank=rank, node=node, exit_code=returncode, tail=tail)
    signum = -returncode
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"SIG{signum}"
    oom_after = oom_kill_count() if signum == signal.SIGKILL else None
    oom = oom_before is not None and oom_after is not None and oom_after > oom_before
    return RankExit(rank=rank, node=node, exit_code=None, signal=name, oom_killed=oom, tail=tail)


def sample_interval_s(env: Mapping[str, str]) -> float:
    """Seconds between device samples: `AIR_SAMPLE_INTERVAL_S` (0 turns sampling off),
    default 2 (what `_sampler.DEFAULT_INTERVAL_S` says; not imported: psutil is heavy).

    Example:
        >>> sample_interval_s({}), sample_interval_s({"AIR_SAMPLE_INTERVAL_S": "0"})
        (2.0, 0.0)
    """
    raw = env.get("AIR_SAMPLE_INTERVAL_S", "")
    try:
        value = float(raw) if raw else 2.0
    except ValueError:
        print(f"[air] ignoring AIR_SAMPLE_INTERVAL_S={raw!r}: not a number", file=sys.stderr)
        return 2.0
    return max(value, 0.0)


def write_exit_record(rank_exit: RankExit, attempt_dir: str | None) -> None:
    """Atomically write `ATTEMPT_DIR/exits/rank-N.json`, which the runner reads (even
    when the gateway was unreachable); nothing without an attempt directory."""
    if not attempt_dir:
        return
    folder = Path(attempt_dir) / "exits"
    final = folder / f"rank-{rank_exit.rank}.json"
    tmp = folder / f".rank-{rank_exit.rank}.json.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(rank_exit.model_dump_json())
        os.replace(tmp, final)
    except OSError as exc:
        print(f"air: could not write {final}: {exc}", file=sys.stderr, flush=True)


def _command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str] | None:
    args = list(argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0] in ("-h", "--help") or args == ["-m"]:
        return None
    # under autolog the program runs as `python SCRIPT` would, after its import hook
    return python_argv(args, os.environ if env is None else env)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the user's program under supervision; returns the exit status to use.

    Example:
        >>> main(["train.py", "--lr", "1"])  # doctest: +SKIP
        0
    """
    command = _command(sys.argv[1:] if argv is None else argv)
    if command is None:
        print(_USAGE, file=sys.stderr)
        return 2
    parent = os.getppid()
    if set_parent_death_signal() and os.getppid() != parent:
        return 128 + signal.SIGKILL  # the agent died while we started
    forwarder = _SignalForwarder()
    forwarder.install()
    oom_before = oom_kill_count()
    child = subprocess.Popen(
        command,
        # trace_env: torch's flight recorder for GPU jobs, so a hang can name its rank
        env={**os.environ, **trace_env(), "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_child_preexec(os.getpid(), forwarder.uses_mask),
    )
    forwarder.start(child)
    # Read only now, while the rank starts: the env contract's model, requests,
    # tenacity and pydantic cost about 0.25 s, which would otherwise delay every launch.
    try:
        ctx = context()
        rank = ctx.rank
    except ConfigError as exc:
        child.kill()
        child.wait()
        print(f"air: {exc}", file=sys.stderr)
        return 2
    from air_sdk.runtime._shipper import shipper_from_env
    from air_sdk.schema.worker_env import WorkerEnv

    shipper = shipper_from_env(flush_interval=0.25)  # threads only after the fork
    shipper.heartbeat()  # the rank is up: the runner marks the job RUNNING once all are
    sampler = None
    interval = sample_interval_s(os.environ)
    if ctx.local_rank == 0 and shipper.enabled and interval:  # one sampler per node
        from air_sdk.runtime._sampler import DeviceSampler

        sampler = DeviceSampler(ctx.node_name, shipper, interval_s=interval)
        sampler.start()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    tail_lock = threading.Lock()
    assert child.stdout is not None
    pump = threading.Thread(
        target=pump_output,
        args=(child.stdout, rank, tail, tail_lock, shipper),
        name="air-output",
        daemon=True,
    )
    pump.start()
    returncode = child.wait()
    ended_at = time.time()  # the death itself: draining the output below takes a while
    pump.join(_DRAIN_AFTER_EXIT_S)
    with tail_lock:
        last_lines = list(tail)
    ended = rank_exit(rank, returncode, last_lines, oom_before, ctx.node_name or None)
    ended = ended.model_copy(update={"ended_at": ended_at})
    # first: the runner reads it even if posting fails
    write_exit_record(ended, os.environ.get(WorkerEnv.env_name("attempt_dir")))
    shipper.report_exit(ended)
    if sampler is not None:
        sampler.stop()
    shipper.close(timeout=_FINAL_FLUSH_S)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
