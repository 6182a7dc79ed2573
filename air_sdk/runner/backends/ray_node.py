"""What runs inside the Ray actor of one node of a job: that node's share of the ranks.

`RayNodeAgent` is a plain class (Ray wraps it with `ray.remote` in
`air_sdk.runner.backends.ray`), so it imports no Ray and is testable as is. On its
node it unpacks the job's bundle (fetched from Ray's object store) into a node-local
temporary directory, starts every local rank under `air_sdk.runtime.supervise` with
the env contract torchrun would set, watches them, and stops them.

It starts the ranks itself rather than a torchrun agent: Ray already places the
node and restarts are the runner's job, so an agent would only add a process
generation, a rendezvous round and an exit barrier. Ranks follow the bundle order
(GROUP_RANK is the bundle index), so MASTER_ADDR is the first bundle's node, where
rank 0 runs.

All ranks are started from one long-lived thread: Linux sends a parent-death
signal when the parent *thread* exits, and a Ray actor's method threads are not
ours to keep alive.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["RankCommand", "RayNodeAgent", "node_rank_env"]

#: how often the monitor thread reaps the ranks
_REAP_S = 0.05
#: env vars of the Ray worker that must not reach user code (cluster credentials)
_SECRET_ENV = ("RAY_AUTH_TOKEN", "AIR_TOKEN")


@dataclass(frozen=True)
class RankCommand:
    """What one node runs: the entrypoint (relative to the code), its args and the env
    every local rank shares."""

    job_id: str
    attempt: int
    node_name: str
    #: this node's index in the placement (torchrun's GROUP_RANK)
    group_rank: int
    num_nodes: int
    ranks_per_node: int
    entrypoint: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    #: an empty CUDA_VISIBLE_DEVICES for CPU jobs; GPU jobs keep the one Ray set
    uses_gpus: bool = False


def node_rank_env(
    cmd: RankCommand, local_rank: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The env torchrun would give `local_rank` of this node, plus the job's env.

    Example:
        >>> c = RankCommand("j", 1, "n1", group_rank=1, num_nodes=2, ranks_per_node=2,
        ...                 entrypoint="train.py")
        >>> e = node_rank_env(c, 1, "10.0.0.1", 29500)
        >>> e["RANK"], e["WORLD_SIZE"], e["GROUP_RANK"], e["LOCAL_WORLD_SIZE"]
        ('3', '4', '1', '2')
    """
    world = cmd.num_nodes * cmd.ranks_per_node
    rank = cmd.group_rank * cmd.ranks_per_node + local_rank
    env = dict(cmd.env or {})
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(cmd.ranks_per_node),
            "GROUP_RANK": str(cmd.group_rank),
            "GROUP_WORLD_SIZE": str(cmd.num_nodes),
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": f"{cmd.job_id}-{cmd.attempt}",
            # No agent store here: rank 0's init_process_group hosts the TCPStore.
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "AIR_NODE_NAME": cmd.node_name,
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def free_port() -> int:
    """A TCP port free on every interface of this node (rank 0's store binds it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def scratch_dir() -> Path:
    """Where node-local files go: Ray's temp dir when the node was given one (so they
    go with the Ray session's files), else the system's."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())


def use_runtime(data: bytes, sha256: str) -> Path:
    """Unpack the gateway's `air_sdk` (a zip sent through Ray's object store) once per
    node and put it first on this process's import path; returns its directory, which
    the ranks get first on PYTHONPATH.

    Example:
        >>> use_runtime(zip_bytes, sha)  # doctest: +SKIP
        PosixPath('/tmp/air-runtime-3f2a9c0d1b7e5a44')
    """
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError("the AIR runtime sent by the gateway arrived damaged (sha256 mismatch)")
    root = scratch_dir() / f"air-runtime-{sha256[:16]}"
    if not (root / "air_sdk").is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".air-runtime-", dir=root.parent))
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                if name.startswith("/") or ".." in name.split("/"):
                    raise ValueError(f"unsafe path {name!r} in the AIR runtime")
            archive.extractall(staging)
        try:
            os.rename(staging, root)
        except OSError:  # another actor on this node got there first
            shutil.rmtree(staging, ignore_errors=True)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


class RayNodeAgent:
    """One node of a job: unpack the code, run the local ranks of an attempt, report,
    stop; then, if the backend keeps the actor, the next attempt (`prepare(..., cmd)`).

    Example (what the Ray backend does through the actor):
        >>> agent = RayNodeAgent(cmd)  # doctest: +SKIP
        >>> port = agent.prepare(bundle_bytes, sha256)  # doctest: +SKIP
        >>> agent.start("10.0.0.1", port)  # doctest: +SKIP
        >>> agent.watch()  # blocks until a rank fails or all ended  # doctest: +SKIP
        (0, 'every rank exited 0')
    """

    def __init__(self, cmd: RankCommand) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"air-{cmd.job_id}-", dir=scratch_dir()))
        self.code_dir = self.workdir / "code"
        self._code_sha256 = ""
        self._run = _AttemptRun(cmd, self.workdir / f"attempt-{cmd.attempt}.log")

    @property
    def cmd(self) -> RankCommand:
        return self._run.cmd

    # -- called by the backend (through Ray) ---------------------------------------------

    def prepare(
        self,
        bundle: bytes,
        sha256: str,
        runtime: bytes | None = None,
        runtime_sha256: str = "",
        cmd: RankCommand | None = None,
    ) -> int:
        """Get ready for an attempt (`cmd`: a later one, after `stop`): put AIR's runtime
        (`runtime`, a zip of `air_sdk` from the gateway) first on the import path, unpack
        the job code unless this node has it; returns a free port when it hosts rank 0."""
        if runtime is not None:
            use_runtime(runtime, runtime_sha256)
        from air_sdk.bundle import unpack_bundle

        if cmd is not None:
            self._run = _AttemptRun(cmd, self.workdir / f"attempt-{cmd.attempt}.log")
        if sha256 != self._code_sha256:
            shutil.rmtree(self.code_dir, ignore_errors=True)
            unpack_bundle(bundle, self.code_dir, expected_sha256=sha256)
            self._code_sha256 = sha256
            self._run.note(f"code unpacked into {self.code_dir} (bundle {sha256[:12]})")
        else:
            self._run.note(f"code of bundle {sha256[:12]} already here (a kept actor)")
        return free_port() if self.cmd.group_rank == 0 else 0

    def start(self, master_addr: str, master_port: int) -> list[int]:
        """Start every local rank; returns the supervisors' pids."""
        return self._run.start(self.code_dir, master_addr, master_port)

    def watch(self, timeout_s: float | None = None) -> tuple[int | None, str]:
        """Block until a rank fails or every rank ended: (exit code, what happened).
        (None, "") if `timeout_s` passed first."""
        return self._run.watch(timeout_s)

    def stop(self, grace_s: float) -> list[str]:
        """SIGTERM every rank's process group, SIGKILL what is left after `grace_s`
        (orphans included); returns the attempt log's last lines."""
        return self._run.stop(grace_s)

    def log_tail(self, num_lines: int = 20) -> list[str]:
        """The last lines of this attempt's output (the ranks' lines, prefixed, and ours)."""
        return self._run.log_tail(num_lines)

    def stacks(self) -> dict[int, str]:
        """Every live rank's Python stack on this node, by global rank (py-spy)."""
        return self._run.stacks()

    def failure_marks(self) -> list[str]:
        """The files this node's ranks left under `$AIR_ATTEMPT_DIR/failure-saves/`."""
        from air_sdk.runtime._failure_save import MARKER_DIR  # importable after `prepare`

        return sorted(p.name for p in (self._run.attempt_dir / MARKER_DIR).glob("*"))

    def close(self) -> None:
        """Stop what still runs and remove the node-local code and logs."""
        self._run.stop(0.5)
        shutil.rmtree(self.workdir, ignore_errors=True)


class _AttemptRun:
    """The ranks of one attempt on this node, and the thread that starts and reaps them."""

    def __init__(self, cmd: RankCommand, log_path: Path) -> None:
        self.cmd = cmd
        self.log_path = log_path
        #: the ranks' $AIR_ATTEMPT_DIR on this node (exit records, failure-save marks)
        self.attempt_dir = log_path.with_suffix("")
        self._supervisors: dict[int, subprocess.Popen[bytes]] = {}  # local rank -> process
        self._exits: dict[int, tuple[float, int]] = {}  # local rank -> (time, code)
        self._changed = threading.Condition()
        self._requests: queue.Queue[tuple[Path, str, int] | None] = queue.Queue()
        self._started = threading.Event()
        self._stopping = False
        self._monitor = threading.Thread(target=self._loop, name="air-node-ranks", daemon=True)
        self._monitor.start()

    def start(self, code_dir: Path, master_addr: str, master_port: int) -> list[int]:
        self._requests.put((code_dir, master_addr, master_port))
        self._started.wait(60)
        with self._changed:
            return [p.pid for p in self._supervisors.values()]

    def watch(self, timeout_s: float | None) -> tuple[int | None, str]:
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

    def stop(self, grace_s: float) -> list[str]:
        with self._changed:
            self._stopping = True
            groups = [p.pid for p in self._supervisors.values()]
            self._changed.notify_all()
        self._requests.put(None)
        for pgid in groups:
            _killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self._alive():
            time.sleep(0.05)
        for _ in range(3):
            left = self._alive()
            if not left:
                break
            for pgid in groups:
                _killpg(pgid, signal.SIGKILL)
            for p in left:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(left, timeout=5)
        self._monitor.join(5)  # the exits are recorded: pending watch() calls return
        return self.log_tail()

    def log_tail(self, num_lines: int = 20) -> list[str]:
        try:
            with open(self.log_path, errors="replace") as f:
                return [line.rstrip("\n") for line in deque(f, maxlen=num_lines)]
        except OSError:
            return []

    def stacks(self) -> dict[int, str]:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        stacks: dict[int, str] = {}
        for p in self._rank_processes():
            try:
                rank = int(p.environ().get("RANK", "-1"))
            except (psutil.Error, ValueError):
                continue
            if not os.path.exists(spy):
                stacks[rank] = "no stack: py-spy is not installed (pip install py-spy)"
                continue
            try:
                out = subprocess.run(
                    [spy, "dump", "--nonblocking", "--pid", str(p.pid)],
                    capture_output=True,
                    text=True,
                    timeout=15,
                )
                stacks[rank] = (out.stdout or out.stderr).strip()[-8000:]
            except (OSError, subprocess.TimeoutExpired) as exc:
                stacks[rank] = f"no stack: py-spy failed ({exc})"
        return stacks

    def note(self, line: str) -> None:
        try:
            with open(self.log_path, "a") as f:
                f.write(f"[air node {self.cmd.node_name}] {line}\n")
        except OSError:
            pass

    # -- the monitor thread: starts the ranks, then reaps them ---------------------------------

    def _loop(self) -> None:
        request = self._requests.get()
        if request is not None:
            try:
                self._spawn(*request)
            except OSError as exc:
                self.note(f"could not start the ranks: {exc}")
                with self._changed:
                    self._exits[0] = (time.time(), 127)
                    self._changed.notify_all()
        self._started.set()
        while True:
            with self._changed:
                running = {lr: p for lr, p in self._supervisors.items() if lr not in self._exits}
            if not running:
                return  # nothing left whose parent-death signal this thread carries
            for local_rank, proc in running.items():
                code = proc.poll()
                if code is not None:
                    with self._changed:
                        self._exits[local_rank] = (time.time(), code)
                        self._changed.notify_all()
            time.sleep(_REAP_S)

    def _spawn(self, code_dir: Path, master_addr: str, master_port: int) -> None:
        cmd = self.cmd
        base = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
        # The runtime must import the same air_sdk as this actor (Ray may have shipped it).
        import air_sdk

        root = str(Path(air_sdk.__file__).resolve().parent.parent)
        base["PYTHONPATH"] = os.pathsep.join(
            [root, *(p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p)]
        )
        if not cmd.uses_gpus:
            base["CUDA_VISIBLE_DEVICES"] = ""
        from air_sdk.runner.backends.base import program_argv

        argv = [
            sys.executable,
            "-m",
            "air_sdk.runtime.supervise",
            *program_argv(cmd.entrypoint),
            *cmd.args,
        ]
        self.attempt_dir.mkdir(parents=True, exist_ok=True)
        base["AIR_ATTEMPT_DIR"] = str(self.attempt_dir)
        with open(self.log_path, "ab") as log, self._changed:
            if self._stopping:
                return
            for local_rank in range(cmd.ranks_per_node):
                env = {**base, **node_rank_env(cmd, local_rank, master_addr, master_port)}
                self._supervisors[local_rank] = subprocess.Popen(
                    argv,
                    cwd=code_dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        first = cmd.group_rank * cmd.ranks_per_node
        self.note(
            f"attempt {cmd.attempt}: started ranks {first}..{first + cmd.ranks_per_node - 1}"
            f" (MASTER_ADDR={master_addr}:{master_port})"
        )

    # -- helpers ---------------------------------------------------------------------------

    def _verdict(self) -> tuple[int, str] | None:
        """Called with the lock held."""
        failed = sorted((ts, lr, code) for lr, (ts, code) in self._exits.items() if code != 0)
        if failed:
            _, local_rank, code = failed[0]
            rank = self.cmd.group_rank * self.cmd.ranks_per_node + local_rank
            return code, f"rank {rank} {_describe(code)}"
        if self._supervisors and len(self._exits) == len(self._supervisors):
            return 0, "every rank exited 0"
        if self._stopping and not self._supervisors:
            return 143, "stopped before its ranks started"
        return None

    def _alive(self) -> list[psutil.Process]:
        """This node's processes of the attempt: the supervisors, their ranks, and any
        re-parented orphan whose env still names this job, attempt and node."""
        found: dict[int, psutil.Process] = {}
        for proc in list(self._supervisors.values()):
            try:
                p = psutil.Process(proc.pid)
                found[p.pid] = p
                for c in p.children(recursive=True):
                    found[c.pid] = c
            except psutil.Error:
                continue
        for p in psutil.process_iter(["pid"]):
            try:
                env = p.environ()
            except psutil.Error:
                continue
            if (
                env.get("AIR_JOB_ID") == self.cmd.job_id
                and env.get("AIR_ATTEMPT") == str(self.cmd.attempt)
                and env.get("AIR_NODE_NAME") == self.cmd.node_name
            ):
                found[p.pid] = p
        found.pop(os.getpid(), None)
        alive = []
        for p in found.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                continue
        return alive

    def _rank_processes(self) -> list[psutil.Process]:
        """The ranks themselves (the supervisors' children)."""
        ranks = []
        for proc in list(self._supervisors.values()):
            try:
                ranks.extend(psutil.Process(proc.pid).children())
            except psutil.Error:
                continue
        return ranks


def _describe(code: int) -> str:
    if code > 128:
        try:
            return f"was killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
