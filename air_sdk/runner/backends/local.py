"""Local backend: every node of a placement is a NodeRunner process on this host.

A job's first launch on a virtual node starts `python -m air_sdk.runner.node` for
it (`air_sdk.runner.node.process`), in a session of its own; the job's later
attempts on that node go to the same process, whose warm interpreters (torch
already imported) become their ranks. The NodeRunner starts the node's ranks with
the env contract (`air_sdk.schema.WorkerEnv`): RANK, WORLD_SIZE and
MASTER_ADDR/PORT come from the placement (rank 0's port is picked here), so there
is no rendezvous. A 2-node job on one machine takes the code path two machines
would: each node's ranks only meet in `init_process_group` on 127.0.0.1.

Everything the gateway knows of a node it reads from the node's records
(`records.py`: pids with their start times, exit codes, the node's verdict), so a
gateway that was SIGKILLed and restarted re-attaches to a running attempt by
reading them: no scan of the host's processes. Teardown asks each NodeRunner to
stop its attempt (SIGTERM to every rank's process group, SIGKILL after the grace to
everything below it) and, should one not answer, kills what its record names.

`AIR_WARM_RANKS=0` in the gateway's environment turns warm interpreters off
(every attempt starts its ranks cold); they need Linux.

With a sandbox (`sandbox=` "auto", "bwrap" or "unshare"; `air_sdk.runner.node.sandbox`)
every rank runs in mount and pid namespaces of its own that hide the gateway's home
but for the job's own code, attempts, checkpoint and output directories. The
sandbox is the same for every attempt of a job, so warm interpreters start inside
it too and serve the next attempt.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.base import LaunchRequest, NodeStatus
from air_sdk.runner.devices import local_virtual_nodes
from air_sdk.runner.job_paths import JobPathPolicy
from air_sdk.runner.node import _procs
from air_sdk.runner.node.env import allowed_env
from air_sdk.runner.node.launch import NodeLaunch
from air_sdk.runner.node.plan import plan_node
from air_sdk.runner.node.process import NodeProcess, attempt_record_path
from air_sdk.runner.node.records import AttemptRecord, failure_marks, log_tail, read_json
from air_sdk.runner.node.sandbox import (
    Sandbox,
    SandboxSpec,
    choose_sandbox,
    gpu_devices,
    under_tmp,
)
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import JobSpec, WorkerEnv

log = logging.getLogger(__name__)

#: the env var that turns warm interpreters off ("0") or on ("1", the default)
WARM_RANKS_ENV = "AIR_WARM_RANKS"
#: a sandboxed rank's home is read-only: caches (torch hub, Hugging Face, Triton's
#: kernels) go to the job's own /tmp, kept across its attempts, unless the job says
SANDBOX_DEFAULTS = {"XDG_CACHE_HOME": "/tmp/.cache", "TRITON_CACHE_DIR": "/tmp/.triton"}
#: how long a stop may take beyond its grace before the backend kills what is left
STOP_SLACK_S = 15.0
#: how long `release` waits for a job's NodeRunners to leave
RELEASE_WAIT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def warm_ranks_enabled(requested: bool | None = None) -> bool:
    """Whether NodeRunners keep warm interpreters: `requested`, else $AIR_WARM_RANKS
    ("1" by default, "0" off). They need Linux (parent-death signals, /proc).

    Example:
        >>> warm_ranks_enabled(False)
        False
    """
    if not sys.platform.startswith("linux"):
        return False
    if requested is not None:
        return requested
    raw = os.environ.get(WARM_RANKS_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{WARM_RANKS_ENV}={raw!r}: give 1 (warm interpreters, the default) or 0")
    return raw != "0"


@dataclass
class _Node:
    name: str
    process: NodeProcess
    record_path: Path
    log_path: Path

    def record(self) -> AttemptRecord | None:
        data = read_json(self.record_path)
        try:
            return AttemptRecord.from_dict(data) if isinstance(data, dict) else None
        except (TypeError, ValueError):
            return None


@dataclass
class LocalAttempt:
    job_id: str
    attempt: int
    attempt_dir: Path
    nodes: list[_Node]


class LocalBackend:
    """Virtual nodes on this machine, each job's node a NodeRunner process.

    Example:
        >>> backend = LocalBackend(num_nodes=2, slots_per_node=1)
        >>> [n.name for n in backend.inventory()]
        ['node-0', 'node-1']
    """

    name = "local"

    def __init__(
        self,
        num_nodes: int = 2,
        slots_per_node: int | None = None,
        *,
        nodes: list[NodeSpec] | None = None,
        warm: bool | None = None,
        sandbox: str = "off",
        home: Path | None = None,
        hidden_files: list[Path] | None = None,
        shared_dirs: list[Path] | None = None,
        allowed_data_roots: list[Path] | None = None,
        shared_data_roots: list[Path] | None = None,
        tenant_data_roots: Mapping[str, Sequence[str | Path]] | None = None,
    ) -> None:
        self._nodes = nodes or local_virtual_nodes(num_nodes, slots_per_node)
        self.warm = warm_ranks_enabled(warm)
        #: how ranks are isolated (`choose_sandbox`); the gateway says which at start-up
        self.sandbox: Sandbox = choose_sandbox(sandbox)
        #: the gateway's home, hidden from sandboxed ranks (else: found from the job's)
        self.home = home
        #: files outside `home` a sandboxed rank must not read (a TLS key)
        self.hidden_files = [str(p) for p in hidden_files or []]
        #: where each sandboxed job's /dev/shm lives (a tmpfs), one directory per job
        self.shm_root = Path("/dev/shm")
        #: directories every sandboxed job may write (data, outputs: `--sandbox-bind`)
        self.shared_dirs = [str(p) for p in shared_dirs or []]
        missing = [p for p in self.shared_dirs if not os.path.isdir(p)]
        if missing and self.sandbox.enabled:
            raise ConfigError(f"--sandbox-bind {missing[0]}: no such directory; create it first")
        #: where jobs may name their own directories besides the home (`job_paths`):
        #: each tenant T under ROOT/T/; shared ones anywhere; a tenant's own anywhere
        self.allowed_data_roots = [str(p) for p in allowed_data_roots or []]
        self.shared_data_roots = [str(p) for p in shared_data_roots or []]
        self.tenant_data_roots = {
            t: [str(p) for p in r] for t, r in (tenant_data_roots or {}).items()
        }
        self._lock = threading.Lock()
        #: job id -> the directory of its NodeRunners (jobs/<id>/nodes)
        self._jobs: dict[str, Path] = {}
        #: the NodeRunner processes this gateway started, by node directory
        self._started: dict[Path, NodeProcess] = {}

    def inventory(self) -> list[NodeSpec]:
        return list(self._nodes)

    def close(self) -> None:
        """Nothing to stop: a NodeRunner outlives its gateway, and leaves on its own
        once its job has no attempt to run."""

    # -- launch ----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> LocalAttempt:
        spec, placement = request.spec, request.placement
        job_nodes = _job_nodes(request.attempt_dir)
        with self._lock:
            self._jobs[request.job_id] = job_nodes
        placed = {a.node for a in placement.nodes}
        for leftover in sorted(job_nodes.glob("*")):  # the job moved off these nodes
            if leftover.name not in placed:
                self._leave(leftover)
        master = ("127.0.0.1", free_port())
        attempt = LocalAttempt(request.job_id, request.attempt, request.attempt_dir, [])
        for index, assignment in enumerate(placement.nodes):
            log_path = request.attempt_dir / "nodes" / f"{assignment.node}.log"
            launch = plan_node(
                worker=request.worker,
                spec=spec,
                node=assignment.node,
                group_rank=index,
                num_nodes=len(placement.nodes),
                entrypoint=request.entrypoint,
                cwd=str(request.code_dir),
                attempt_dir=str(request.attempt_dir),
                log_path=str(log_path),
                master=master,
                cuda_visible_devices=",".join(str(g) for g in assignment.gpus),
                loopback=True,
                warm=self.warm,
            )
            if self.sandbox.enabled:
                box = self.sandbox_spec(
                    request.job_id, request.attempt_dir, launch, tenant=request.tenant
                )
                own = [box.tmp, box.shm] if box.shm else [box.tmp]
                launch = dataclasses.replace(
                    launch,
                    wrapper=self.sandbox.wrapper(box),
                    defaults={**launch.defaults, **SANDBOX_DEFAULTS},
                    limits=dataclasses.replace(
                        launch.limits, disk_dirs=[*launch.limits.disk_dirs, *own]
                    ),
                )
            node_dir = job_nodes / assignment.node
            process = self._kept(node_dir)
            if process is not None:
                process.send("launch", launch=launch)
            else:
                env = self._process_env(request.job_id, assignment.node)
                process = NodeProcess.start(
                    node_dir, request.job_id, assignment.node, env, first=launch
                )
                with self._lock:
                    self._started[node_dir] = process
            record_path = attempt_record_path(request.attempt_dir, assignment.node)
            attempt.nodes.append(_Node(assignment.node, process, record_path, log_path))
        return attempt

    def sandbox_spec(
        self, job_id: str, attempt_dir: Path, launch: NodeLaunch, *, tenant: str = "default"
    ) -> SandboxSpec:
        """What `launch`'s ranks see (`air_sdk.runner.node.sandbox`): the home hidden but
        for the job's code, attempts, checkpoint and output directories, the job's own
        /tmp (jobs/<id>/tmp) and /dev/shm, the GPUs. A checkpoint or output directory
        in the home must be the job's own. The same for every attempt of the job, so a
        warm interpreter started in it serves the next attempt."""
        from air_sdk.config import config_file
        from air_sdk.errors import ConfigError
        from air_sdk.runner.outputs import default_output_dir
        from air_sdk.schema import WorkerEnv

        job_root = attempt_dir.parent.parent
        home = self.home or job_root.parent.parent
        # every attempt's directory (not only this one's): the next attempt's ranks may
        # be warm interpreters sandboxed now. The node records in it are the job's own to
        # spoil; the backend trusts a pid there only below the NodeRunner (`_live_ranks`).
        writable = [launch.cwd, str(attempt_dir.parent)]
        env = launch.ranks[0].env if launch.ranks else {}
        own: list[str | Path] = [
            job_root,
            default_output_dir(job_id=job_id, home=home, storage=None),
        ]
        for field in ("checkpoint_dir", "output_dir"):
            path = env.get(WorkerEnv.env_name(field))
            if not path or not os.path.isabs(path):  # none, or an fsspec URL
                continue
            # checked at submit too; again here, as the directory is made (issue 19)
            why = self.path_policy(home).refusal(field, path, own=own, tenant=tenant)
            if why is not None:
                raise ConfigError(why)
            Path(path).mkdir(parents=True, exist_ok=True)
            writable.append(path)
        tmp = job_root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        shm = None
        if self.shm_root.is_dir():
            shm = self.shm_root / f"air-{job_id}"
            shm.mkdir(mode=0o700, exist_ok=True)
        hide = [str(home)]
        client_dir = config_file().parent
        if not client_dir.resolve().is_relative_to(home.resolve()) and client_dir.is_dir():
            hide.append(str(client_dir))  # the client config holds the admin token
        import air_sdk

        python_path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        needed = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
        needed += [str(Path(air_sdk.__file__).resolve().parents[1]), *python_path]
        return SandboxSpec(
            keep=under_tmp(needed),
            hide=hide,
            writable=list(dict.fromkeys(writable)),
            tmp=str(tmp),
            shm=str(shm) if shm else None,
            shared=self.shared_dirs,
            hide_files=self.hidden_files,
            devices=gpu_devices(),
            cwd=launch.cwd,
        )

    def path_policy(self, home: Path | None = None) -> JobPathPolicy:
        """Where this backend's jobs may name their own directories (`job_paths`)."""
        from air_sdk.config import config_file

        return JobPathPolicy.build(
            home or self.home or Path.home(),
            self.allowed_data_roots,
            [config_file().parent],
            shared=[*self.shared_data_roots, *self.shared_dirs],
            tenant_roots=self.tenant_data_roots,
        )

    def job_path_refusal(self, spec: JobSpec, tenant: str = "default") -> str | None:
        """Why `spec`'s own directories are refused for a job of `tenant` (sandboxed
        ranks only), or None."""
        if not self.sandbox.enabled:
            return None
        return self.path_policy().spec_refusal(spec, tenant)

    def _kept(self, node_dir: Path) -> NodeProcess | None:
        """The job's NodeRunner of this node, if one runs (from an earlier attempt)."""
        with self._lock:
            started = self._started.get(node_dir)
        if started is not None and started.alive():
            return started
        return NodeProcess.find(node_dir)

    @staticmethod
    def _process_env(job_id: str, node: str) -> dict[str, str]:
        """A NodeRunner process's environment, which its ranks start from: the gateway's
        allowed part (`air_sdk.runner.node.env`), this air_sdk on the import path, and
        the job and node it serves (so `ps e` shows whose it is)."""
        env = allowed_env(os.environ)
        import air_sdk

        root = str(Path(air_sdk.__file__).resolve().parents[1])
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in path and root not in sys.path[1:]:
            env["PYTHONPATH"] = os.pathsep.join([root, *path])
        env[WorkerEnv.env_name("job_id")] = job_id
        env[WorkerEnv.env_name("node_name")] = node
        return env

    def attach(
        self, job_id: str, attempt: int, attempt_dir: Path, ranks_per_node: int
    ) -> LocalAttempt | None:
        """Adopt an attempt whose NodeRunners outlived a previous gateway, found by the
        records they keep; None when none of them runs any more."""
        job_nodes = _job_nodes(attempt_dir)
        nodes = []
        for path in sorted((attempt_dir / "nodes").glob("*.json")):
            data = read_json(path)
            try:
                record = AttemptRecord.from_dict(data) if isinstance(data, dict) else None
            except (TypeError, ValueError):
                record = None
            if record is None or record.job_id != job_id or record.attempt != attempt:
                continue
            # The NodeRunner as its own record says (jobs/<id>/nodes: no rank can write
            # it), not as the attempt's record does (a rank can): a live process the
            # attempt's record names is believed only when the NodeRunner's agrees.
            node_dir = job_nodes / record.node
            runner = NodeProcess.find(node_dir)
            if runner is not None and runner.pid == record.runner_pid:
                process = runner
            elif runner is None and not _procs.alive(record.runner_pid, record.runner_create_time):
                process = NodeProcess(node_dir, record.runner_pid, record.runner_create_time)
            else:
                continue
            log_path = attempt_dir / "nodes" / f"{record.node}.log"
            nodes.append(_Node(record.node, process, path, log_path))
        if not any(n.process.alive() for n in nodes):
            return None
        with self._lock:
            self._jobs[job_id] = job_nodes
        return LocalAttempt(job_id, attempt, attempt_dir, nodes)

    # -- watching --------------------------------------------------------------------------

    def poll(self, handle: LocalAttempt) -> list[NodeStatus]:
        return [self._status(handle, n) for n in handle.nodes]

    def _status(self, handle: LocalAttempt, node: _Node) -> NodeStatus:
        record = node.record()
        if record is not None and record.attempt == handle.attempt and record.verdict:
            code, detail = record.verdict
            return NodeStatus(node.name, code, "" if code == 0 else detail)
        if node.process.alive():
            return NodeStatus(node.name, None)
        returncode = node.process.returncode()
        if returncode is not None and returncode < 0:
            how = f"was killed by {_procs.signal_name(-returncode)}"
        elif returncode is not None:
            how = f"exited with code {returncode}"
        else:
            how = "is gone"
        code = returncode if returncode else 1
        return NodeStatus(node.name, code, f"its NodeRunner (pid {node.process.pid}) {how}")

    def failure_marks(self, handle: LocalAttempt) -> set[str]:
        # every virtual node is this machine: the ranks share the attempt's directory
        return set(failure_marks(handle.attempt_dir))

    def rank_stacks(self, handle: LocalAttempt) -> dict[int, str]:
        """Every live rank's Python stack, by rank (py-spy also reads stopped processes)."""
        return _procs.dump_stacks(self._live_ranks(handle))

    def node_log_tail(self, handle: LocalAttempt, node: str, num_lines: int = 20) -> list[str]:
        for n in handle.nodes:
            if n.name == node:
                return log_tail(n.log_path, num_lines)
        return []

    def _live_ranks(self, handle: LocalAttempt) -> dict[int, int]:
        """{rank: pid} of the attempt's live ranks, from the node records. A pid counts
        only below its NodeRunner: a job's ranks can write their attempt's records, and
        must not get another process stack-dumped or killed by naming it there."""
        live = {}
        for node in handle.nodes:
            record = node.record()
            if record is None or record.attempt != handle.attempt:
                continue
            below = set(_procs.descendants(node.process.pid))
            for r in record.ranks:
                if r.returncode is None and r.pid in below and _procs.alive(r.pid, r.create_time):
                    live[r.rank] = r.pid
        return live

    # -- stopping --------------------------------------------------------------------------

    def terminate(
        self, handle: LocalAttempt, grace_s: float = 5.0, *, wait_first_s: float = 0.0
    ) -> None:
        deadline = time.monotonic() + wait_first_s
        while time.monotonic() < deadline and any(s.exit_code is None for s in self.poll(handle)):
            time.sleep(0.05)
        for node in handle.nodes:
            if node.process.alive():
                node.process.send("stop", attempt=handle.attempt, grace_s=grace_s)
        deadline = time.monotonic() + grace_s + STOP_SLACK_S
        while time.monotonic() < deadline and not all(
            self._stopped(handle, n) for n in handle.nodes
        ):
            time.sleep(0.02)
        for node in handle.nodes:
            if not self._stopped(handle, node):
                log.warning(
                    "%s attempt %s: the NodeRunner of %s did not stop its ranks; killing them",
                    handle.job_id,
                    handle.attempt,
                    node.name,
                )
                node.process.kill()  # its ranks die with it (parent-death signal)
        self._kill_recorded(handle)

    def _stopped(self, handle: LocalAttempt, node: _Node) -> bool:
        if not node.process.alive():
            return True
        record = node.record()
        return record is not None and record.attempt == handle.attempt and record.stopped

    def _kill_recorded(self, handle: LocalAttempt) -> None:
        """SIGKILL every rank the records name that still runs, with its process group
        (what a NodeRunner that died before stopping them may have left)."""
        for _ in range(3):
            live = self._live_ranks(handle)
            if not live:
                return
            for pid in live.values():
                _procs.killpg(pid, signal.SIGKILL)
                _procs.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def release(self, job_id: str) -> None:
        """The job ended (or went back to the queue): its NodeRunners leave, with their
        warm interpreters. Returns once they are gone."""
        with self._lock:
            job_nodes = self._jobs.pop(job_id, None)
        if job_nodes is None:
            return
        for node_dir in sorted(job_nodes.glob("*")):
            self._leave(node_dir)
        shutil.rmtree(self.shm_root / f"air-{job_id}", ignore_errors=True)

    def _leave(self, node_dir: Path) -> None:
        with self._lock:
            started = self._started.pop(node_dir, None)
        process = started if started is not None and started.alive() else NodeProcess.find(node_dir)
        if process is None:
            return
        process.send("exit", grace_s=0.0)
        deadline = time.monotonic() + RELEASE_WAIT_S
        while process.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if process.alive():
            log.warning("the NodeRunner in %s did not leave; killing it", node_dir)
            process.kill()


def _job_nodes(attempt_dir: Path) -> Path:
    """jobs/<id>/nodes, from jobs/<id>/attempts/<n>."""
    return attempt_dir.parent.parent / "nodes"
