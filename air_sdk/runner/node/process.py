"""A local NodeRunner process: one per job and virtual node, outliving its gateway.

    python -m air_sdk.runner.node NODE_DIR JOB_ID NODE

The local backend starts one with the job's first launch on a node, in a session
of its own, and keeps it for the job's later attempts there (its warm interpreters
are the next attempt's ranks). It takes commands as files in `NODE_DIR/inbox/`
(written whole, then renamed into place), woken by SIGUSR1 or, at the latest, by
its 1 s look at the inbox:

    launch {"launch": NodeLaunch}        start an attempt's ranks
    stop   {"attempt": N, "grace_s": S}  SIGTERM, SIGKILL after S, wait until gone
    exit   {"grace_s": S}                stop, kill the warm interpreters, leave

and keeps `NODE_DIR/runner.json` and `attempts/<n>/nodes/<node>.json` up to date
(`records.py`). It needs no gateway: a SIGKILLed gateway leaves it running its
ranks, and the next gateway on the same home finds it through those records. It
leaves on `exit`, on SIGTERM (stopping its ranks with a 5 s grace), or after
`IDLE_EXIT_S` without an attempt to run. Its ranks die with it (parent-death
signal). `NodeProcess` is the gateway's side.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from air_sdk.runner.node import _procs
from air_sdk.runner.node.launch import NodeLaunch
from air_sdk.runner.node.records import (
    AttemptRecord,
    RunnerRecord,
    read_json,
    write_json,
)
from air_sdk.runner.node.runner import NodeRunner

__all__ = ["IDLE_EXIT_S", "NodeProcess", "attempt_record_path", "main"]

log = logging.getLogger(__name__)

#: a NodeRunner with no attempt to run leaves after this long (its job ended while no
#: gateway was there to say so)
IDLE_EXIT_S = 120.0
#: a SIGTERM to the NodeRunner stops its ranks with this grace
SIGTERM_GRACE_S = 5.0
_WAKE = signal.SIGUSR1
_LEAVE = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_INBOX = "inbox"
_RUNNER = "runner.json"


def attempt_record_path(attempt_dir: Path, node: str) -> Path:
    """Where a node's record of an attempt lives."""
    return attempt_dir / "nodes" / f"{node}.json"


class NodeProcess:
    """The gateway's handle on one local NodeRunner process.

    Example:
        >>> proc = NodeProcess.start(job_dir / "nodes" / "node-0", "j1", "node-0", env)  # doctest: +SKIP
        >>> proc.send("launch", launch=launch)  # doctest: +SKIP
    """

    def __init__(
        self,
        node_dir: Path,
        pid: int,
        create_time: float | None,
        popen: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.node_dir = node_dir
        self.pid = pid
        self.create_time = create_time
        #: set when this gateway started it (it can then read its exit status)
        self.popen = popen

    @classmethod
    def start(
        cls, node_dir: Path, job_id: str, node: str, env: dict[str, str], first: NodeLaunch
    ) -> NodeProcess:
        """Start a NodeRunner process whose first command is to launch `first`."""
        (node_dir / _INBOX).mkdir(parents=True, exist_ok=True)
        _post(node_dir, "launch", {"launch": _as_dict(first)})
        with open(node_dir / "runner.log", "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "air_sdk.runner.node", str(node_dir), job_id, node],
                env=env,
                cwd=node_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a job outlives its gateway
            )
        return cls(node_dir, popen.pid, _procs.create_time(popen.pid), popen)

    @classmethod
    def find(cls, node_dir: Path) -> NodeProcess | None:
        """The NodeRunner process of `node_dir` if it still runs (pid and start time)."""
        record = cls.read(node_dir)
        if record is None or not _procs.alive(record.pid, record.create_time):
            return None
        return cls(node_dir, record.pid, record.create_time)

    @staticmethod
    def read(node_dir: Path) -> RunnerRecord | None:
        data = read_json(node_dir / _RUNNER)
        try:
            return RunnerRecord.from_dict(data) if isinstance(data, dict) else None
        except TypeError:
            return None

    def record(self) -> RunnerRecord | None:
        record = self.read(self.node_dir)
        return record if record is not None and record.pid == self.pid else None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return _procs.alive(self.pid, self.create_time)

    def returncode(self) -> int | None:
        """Its exit status when this gateway started it and it ended; else None."""
        return self.popen.poll() if self.popen is not None else None

    def send(self, kind: str, **body: Any) -> None:
        """Queue a command and wake the process (only once it said it listens: an
        early SIGUSR1 would kill it)."""
        _post(self.node_dir, kind, {k: _as_dict(v) for k, v in body.items()})
        if self.record() is not None and self.alive():
            _procs.kill(self.pid, _WAKE)

    def kill(self) -> None:
        """SIGKILL the process itself (its ranks follow: parent-death signal)."""
        if self.alive():
            _procs.kill(self.pid, signal.SIGKILL)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _as_dict(value: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def _post(node_dir: Path, kind: str, body: dict[str, Any]) -> None:
    write_json(node_dir / _INBOX / f"{time.time_ns():020d}-{kind}.json", {"kind": kind, **body})


# -- the process -------------------------------------------------------------------------------


class _Service:
    def __init__(self, node_dir: Path, job_id: str, node: str) -> None:
        self.node_dir = node_dir
        self.job_id = job_id
        self.node = node
        self.pid = os.getpid()
        self.create_time = _procs.create_time(self.pid)
        self._lock = threading.Lock()
        self._stopped = False
        self._idle_since = time.monotonic()
        self.runner = NodeRunner(base_env=dict(os.environ), on_change=self._write_records)
        self._leaving = False
        self._warm_written = 0
        self._signalled: int | None = None
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        # Handlers, not a blocked mask: children inherit a mask (a rank must get SIGTERM),
        # while a Python handler becomes the default action again in an exec'd child.
        signal.set_wakeup_fd(wake_w)
        signal.signal(_WAKE, lambda signum, frame: None)
        for sig in _LEAVE:
            signal.signal(sig, self._on_leave)

    def _on_leave(self, signum: int, frame: Any) -> None:
        self._signalled = signum

    def run(self) -> None:
        self._write_records()  # from now on a gateway may wake us with SIGUSR1
        while not self._leaving:
            self._handle_inbox()
            if self._leaving:
                break
            busy = self._busy()
            if busy:
                self._idle_since = time.monotonic()
            elif time.monotonic() - self._idle_since > IDLE_EXIT_S:
                log.info("no attempt for %.0f s: leaving", IDLE_EXIT_S)
                break
            select.select([self._wake_r], [], [], 1.0)
            try:
                while os.read(self._wake_r, 512):
                    pass
            except OSError:
                pass
            if self._signalled is not None:
                log.info("got %s: stopping the ranks", signal.Signals(self._signalled).name)
                self.runner.stop(SIGTERM_GRACE_S)
                self._stopped = True
                break
            if self.runner.warm_pool.num_ready() != self._warm_written:
                self._write_records()  # warm interpreters get ready without telling anyone
        self.runner.close()
        self._write_records(final=True)

    def _busy(self) -> bool:
        launch = self.runner.launch
        return launch is not None and not self._stopped and self.runner.verdict() is None

    def _handle_inbox(self) -> None:
        inbox = self.node_dir / _INBOX
        try:
            names = sorted(p for p in os.listdir(inbox) if p.endswith(".json"))
        except OSError:
            return
        for name in names:
            if name.startswith("."):
                continue
            path = inbox / name
            command = read_json(path)
            path.unlink(missing_ok=True)
            if not isinstance(command, dict):
                continue
            try:
                self._do(command)
            except Exception:  # a bad command must not take the node's ranks down
                log.exception("command %s failed", name)
            if self._leaving:
                return

    def _do(self, command: dict[str, Any]) -> None:
        kind = command.get("kind")
        if kind == "launch":
            launch = NodeLaunch.from_dict(command["launch"])
            if self._busy():
                self.runner.stop(0.0)
            self._stopped = False
            self.runner.start(launch)
        elif kind == "stop":
            current = self.runner.launch
            if current is not None and current.attempt == command.get("attempt"):
                self.runner.stop(float(command.get("grace_s", 0.0)))
                self._stopped = True
                self._write_records()
        elif kind == "exit":
            self.runner.stop(float(command.get("grace_s", 0.0)))
            self._stopped = True
            self._leaving = True

    def _write_records(self, final: bool = False) -> None:
        with self._lock:
            launch = self.runner.launch
            runner_path = self.node_dir / _RUNNER
            if final:
                record = self.read_own()
                if record is not None:
                    runner_path.unlink(missing_ok=True)
            else:
                self._warm_written = self.runner.warm_pool.num_ready()
                write_json(
                    runner_path,
                    RunnerRecord(
                        pid=self.pid,
                        create_time=self.create_time,
                        job_id=self.job_id,
                        node=self.node,
                        attempt=launch.attempt if launch else None,
                        busy=self._busy(),
                        warm_ready=self._warm_written,
                    ),
                )
            if launch is None:
                return
            ranks = self.runner.ranks()
            write_json(
                attempt_record_path(Path(launch.attempt_dir), self.node),
                AttemptRecord(
                    job_id=self.job_id,
                    attempt=launch.attempt,
                    node=self.node,
                    runner_pid=self.pid,
                    runner_create_time=self.create_time,
                    ranks=ranks,
                    verdict=self.runner.verdict(),
                    stopped=(self._stopped or final)
                    and all(r.returncode is not None for r in ranks),
                ),
            )

    def read_own(self) -> RunnerRecord | None:
        record = NodeProcess.read(self.node_dir)
        return record if record is not None and record.pid == self.pid else None


def main(argv: list[str] | None = None) -> int:
    """Run a NodeRunner process (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m air_sdk.runner.node NODE_DIR JOB_ID NODE", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    _Service(Path(args[0]), args[1], args[2]).run()
    return 0
