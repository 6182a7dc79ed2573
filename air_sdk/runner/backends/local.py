"""Local backend: every node of a placement is a torch elastic agent on this host.

Each node runs a torchrun agent with c10d rendezvous on 127.0.0.1, in its own
session, so a 2-node job on one machine takes exactly the code path two machines
would. The agent is `python -m air_sdk._agent`: torchrun, polling its local
rendezvous every 50 ms instead of every second. Every rank runs under `air_sdk.runtime.supervise`,
which captures its output and records how it ended.

torchrun starts workers in their own sessions, so killing an agent's process
group can orphan them. Teardown therefore kills the whole tree: the agent's
descendants as seen before the kill, plus every process whose environment
carries this job's AIR_JOB_ID and attempt (a sweep that also finds re-parented
orphans), and the supervisor puts a parent-death signal on every rank.

A restart would pay a fresh interpreter and `import torch` per node (about 2 s
here) where torchrun's own restarts reuse a live agent, so the backend keeps a
pool of warm agents (`_warm.py`): processes that already imported torchrun and
wait for an agent's command. `launch` takes a ready one per node when there is
one, else starts a cold agent, and a replacement starts warming at once. A warm
agent shows its attempt's environment and command line in /proc like a cold one
(the sweep and `attach` find it the same way), and its pid is tracked explicitly
besides. `AIR_WARM_AGENTS=N` sets the pool size (default: one per virtual node,
at most 4; 0 turns it off).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from air_sdk._agent import MODULE as AGENT_MODULE
from air_sdk._agent import is_agent
from air_sdk.errors import ConfigError
from air_sdk.runner.backends._warm import WarmAgentPool
from air_sdk.runner.backends.base import LaunchRequest, NodeStatus, program_argv
from air_sdk.runner.devices import local_virtual_nodes
from air_sdk.runtime._failure_save import MARKER_DIR
from air_sdk.scheduler import NodeSpec

log = logging.getLogger(__name__)

#: the env var that sizes the warm agent pool (0: off)
WARM_AGENTS_ENV = "AIR_WARM_AGENTS"
#: the default pool is one warm agent per virtual node, but never more than this
MAX_DEFAULT_WARM_AGENTS = 4
#: an explicit size above this is refused (each idle one holds ~230 MB)
MAX_WARM_AGENTS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def warm_agent_count(requested: int | None, num_nodes: int) -> int:
    """The warm pool's size: `requested`, else $AIR_WARM_AGENTS, else one per node (at
    most 4). Warm agents need Linux (/proc, parent-death signals): 0 elsewhere.

    Example:
        >>> warm_agent_count(0, 2)  # off
        0
    """
    if not sys.platform.startswith("linux"):
        return 0
    if requested is None:
        raw = os.environ.get(WARM_AGENTS_ENV, "").strip()
        if not raw:
            return min(num_nodes, MAX_DEFAULT_WARM_AGENTS)
        try:
            requested = int(raw)
        except ValueError:
            requested = -1
        if not 0 <= requested <= MAX_WARM_AGENTS:
            raise ConfigError(
                f"{WARM_AGENTS_ENV}={raw!r}: give a whole number of warm agents from 0 (off)"
                f" to {MAX_WARM_AGENTS}"
            )
    if not 0 <= requested <= MAX_WARM_AGENTS:
        raise ConfigError(f"warm_agents={requested}: give 0 (off) to {MAX_WARM_AGENTS}")
    return requested


@dataclass
class _Node:
    name: str
    #: the agent; None when re-attached after a gateway restart (not our child then)
    proc: subprocess.Popen[bytes] | None
    log_path: Path
    #: every pid ever seen under this agent; teardown kills them all
    pids: set[int] = field(default_factory=set)
    agent_pid: int = 0
    ranks_per_node: int = 1
    tree_seen: float = -1e9
    #: the agent's start time (psutil), to tell it from a later process with its pid
    agent_created: float = 0.0

    def exit_code(self, attempt_dir: Path) -> int | None:
        """The agent's exit code; for an adopted agent (not our child, so no wait
        status) 0 when every rank of this node left a successful exit record, else 1."""
        if self.proc is not None:
            return self.proc.poll()
        if _proc(self.agent_pid) is not None:
            return None
        ok = 0
        for f in (attempt_dir / "exits").glob("rank-*.json"):
            try:
                record = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if record.get("node") == self.name and record.get("exit_code") == 0:
                ok += 1
        return 0 if ok >= self.ranks_per_node else 1


@dataclass
class LocalAttempt:
    job_id: str
    attempt: int
    rdzv_port: int
    nodes: list[_Node]
    attempt_dir: Path


class LocalBackend:
    """Virtual nodes on this machine, each a torchrun agent.

    The warm agent pool starts filling at the first `launch` (or `attach`); `close()`
    kills its idle processes (running jobs are left running).

    Example:
        >>> backend = LocalBackend(num_nodes=2, slots_per_node=1)
        >>> [n.name for n in backend.inventory()]
        ['node-0', 'node-1']
        >>> backend.close()
    """

    name = "local"

    def __init__(
        self,
        num_nodes: int = 2,
        slots_per_node: int | None = None,
        *,
        nodes: list[NodeSpec] | None = None,
        warm_agents: int | None = None,
    ) -> None:
        self._nodes = nodes or local_virtual_nodes(num_nodes, slots_per_node)
        size = warm_agent_count(warm_agents, len(self._nodes))
        self.warm_pool: WarmAgentPool | None = (
            WarmAgentPool(size, agent_base_env) if size > 0 else None
        )

    def inventory(self) -> list[NodeSpec]:
        return list(self._nodes)

    def close(self) -> None:
        """Kill the idle warm agents and stop warming new ones. Attempts keep running."""
        if self.warm_pool is not None:
            self.warm_pool.close()

    def launch(self, request: LaunchRequest) -> LocalAttempt:
        spec = request.spec
        placement = request.placement
        port = free_port()
        request.attempt_dir.mkdir(parents=True, exist_ok=True)
        attempt = LocalAttempt(request.job_id, request.attempt, port, [], request.attempt_dir)
        ranks_per_node = spec.resources.ranks_per_node
        if self.warm_pool is not None:
            self.warm_pool.start()
        for assignment in placement.nodes:
            env = agent_base_env(spec.env)
            env.update(request.env)
            env.update(
                {
                    "AIR_NODE_NAME": assignment.node,
                    "AIR_ATTEMPT_DIR": str(request.attempt_dir),
                    "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in assignment.gpus),
                }
            )
            cmd = [
                sys.executable,
                "-m",
                AGENT_MODULE,  # torchrun, polling its local rendezvous every 50 ms
                f"--nnodes={len(placement.nodes)}",
                f"--nproc-per-node={ranks_per_node}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={request.job_id}-{request.attempt}",
                "--local-addr=127.0.0.1",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                "-m",
                "air_sdk.runtime.supervise",
                *program_argv(request.entrypoint),
                *spec.args,
            ]
            log_path = request.attempt_dir / f"{assignment.node}.agent.log"
            proc = self._start_agent(cmd, env, request.code_dir, log_path)
            node = _Node(assignment.node, proc, log_path, {proc.pid}, proc.pid, ranks_per_node)
            node.agent_created = _create_time(proc.pid)
            attempt.nodes.append(node)
        return attempt

    def _start_agent(
        self, cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path
    ) -> subprocess.Popen[bytes]:
        """A warm agent when a ready one fits, else a cold one."""
        if self.warm_pool is not None:
            agent = self.warm_pool.take(env)
            if agent is not None and agent.launch(cmd, env, str(cwd), str(log_path)):
                log.debug("%s: warm agent %d", env.get("AIR_NODE_NAME"), agent.pid)
                return agent.proc
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc

    def attach(
        self, job_id: str, attempt: int, attempt_dir: Path, ranks_per_node: int
    ) -> LocalAttempt | None:
        """Adopt the agents of an attempt that outlived a previous gateway, found by the
        AIR_JOB_ID/AIR_ATTEMPT in their environment; None when none is left."""
        if self.warm_pool is not None:  # its next restart should find warm agents
            self.warm_pool.start()
        nodes: dict[str, _Node] = {}
        for pid in sorted(job_processes(job_id, attempt)):
            p = _proc(pid)
            if p is None:
                continue
            try:
                cmdline, env = p.cmdline(), p.environ()
            except psutil.Error:
                continue
            if not is_agent(cmdline):
                continue  # a supervisor or a rank: found again under its agent
            name = env.get("AIR_NODE_NAME", f"pid-{pid}")
            node = _Node(name, None, attempt_dir / f"{name}.agent.log", {pid}, pid, ranks_per_node)
            node.agent_created = _create_time(pid)
            self._remember_tree(node, every_s=0)
            nodes[name] = node
        if not nodes:
            return None
        return LocalAttempt(job_id, attempt, 0, list(nodes.values()), attempt_dir)

    def rank_stacks(self, handle: LocalAttempt) -> dict[int, str]:
        """Every rank's Python stack, by rank (py-spy, which also reads stopped processes)."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        stacks: dict[int, str] = {}
        for rank, pid in rank_processes(handle.job_id, handle.attempt).items():
            if not os.path.exists(spy):
                stacks[rank] = "no stack: py-spy is not installed (pip install py-spy)"
                continue
            try:
                out = subprocess.run(
                    [spy, "dump", "--nonblocking", "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    timeout=15,
                )
                stacks[rank] = (out.stdout or out.stderr).strip()[-8000:]
            except (OSError, subprocess.TimeoutExpired) as exc:
                stacks[rank] = f"no stack: py-spy failed ({exc})"
        return stacks

    def failure_marks(self, handle: LocalAttempt) -> set[str]:
        # every virtual node is this machine: the ranks share the attempt's directory
        return {p.name for p in (handle.attempt_dir / MARKER_DIR).glob("*")}

    def poll(self, handle: LocalAttempt) -> list[NodeStatus]:
        statuses = []
        for node in handle.nodes:
            self._remember_tree(node)
            code = node.exit_code(handle.attempt_dir)
            detail = ""
            if code is not None and code < 0:
                detail = f"agent killed by {signal.Signals(-code).name}"
            statuses.append(NodeStatus(node.name, code, detail))
        return statuses

    def terminate(
        self, handle: LocalAttempt, grace_s: float = 5.0, *, wait_first_s: float = 0.0
    ) -> None:
        for node in handle.nodes:
            self._remember_tree(node, every_s=0)
        deadline = time.monotonic() + wait_first_s
        while time.monotonic() < deadline and any(
            n.exit_code(handle.attempt_dir) is None for n in handle.nodes
        ):
            time.sleep(0.05)
        # SIGTERM the agents: torchrun forwards it to its workers and the supervisor
        # forwards it to the rank, so a training script can save on SIGTERM.
        for node in handle.nodes:
            if _proc(node.agent_pid) is not None:
                _signal(node.agent_pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self._alive_pids(handle):
            time.sleep(0.05)
        for _ in range(3):
            left = self._alive_pids(handle)
            if not left:
                break
            for pid in left:
                _signal(pid, signal.SIGKILL)
            # one lookup per pid: a process that dies between two lookups must not
            # slip in as None (psutil.wait_procs would fail on it)
            psutil.wait_procs([p for p in map(_proc, left) if p is not None], timeout=5)
        for node in handle.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def node_log_tail(self, handle: LocalAttempt, node: str, num_lines: int = 20) -> list[str]:
        for n in handle.nodes:
            if n.name == node:
                try:
                    with open(n.log_path, errors="replace") as f:
                        return [line.rstrip("\n") for line in deque(f, maxlen=num_lines)]
                except OSError:
                    return []
        return []

    # -- process tree ------------------------------------------------------------------

    def _remember_tree(self, node: _Node, *, every_s: float = 1.0) -> None:
        # A /proc walk per node per tick cost ~6% of the gateway with one job: once a
        # second is plenty to learn new pids (teardown also sweeps by environment).
        now = time.monotonic()
        if now - node.tree_seen < every_s:
            return
        node.tree_seen = now
        try:
            children = psutil.Process(node.agent_pid).children(recursive=True)
        except psutil.Error:
            return
        node.pids.update(c.pid for c in children)

    def _alive_pids(self, handle: LocalAttempt) -> set[int]:
        alive = set()
        for node in handle.nodes:
            for pid in node.pids:
                p = _proc(pid)
                if p is not None and (_belongs(p, handle) or _is_agent(p, node)):
                    alive.add(pid)
        alive.update(job_processes(handle.job_id, handle.attempt))
        return alive


def agent_base_env(job_env: dict[str, str] | None = None) -> dict[str, str]:
    """What every agent's environment starts from: the gateway's own, less its secrets,
    plus the job's and the settings local multi-node runs need. A warm process is
    started with this (no job env), so its interpreter matches a cold agent's."""
    env = dict(os.environ)
    # Secrets of the gateway's own environment must not leak into jobs.
    env.pop("AIR_TOKEN", None)
    env.update(job_env or {})
    env.update(
        {
            # Measured here: a TCPStore shared across attempts lost 3 of 8 restarts.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo"),
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _create_time(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def _is_agent(p: psutil.Process, node: _Node) -> bool:
    """The node's agent itself, known by pid and start time (a warm agent's environment
    is found too, but this does not depend on reading it)."""
    try:
        return (
            p.pid == node.agent_pid
            and node.agent_created > 0
            and (abs(p.create_time() - node.agent_created) < 0.05)
        )
    except psutil.Error:
        return False


def _proc(pid: int) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        return None if p.status() == psutil.STATUS_ZOMBIE else p
    except psutil.Error:
        return None


def _belongs(p: psutil.Process, handle: LocalAttempt) -> bool:
    """Guard against pid reuse: only kill a pid that still carries this attempt."""
    try:
        env = p.environ()
    except psutil.Error:
        return False
    return env.get("AIR_JOB_ID") == handle.job_id and env.get("AIR_ATTEMPT") == str(handle.attempt)


def rank_processes(job_id: str, attempt: int | None = None) -> dict[int, int]:
    """{rank: pid} of the job's training processes: the rank supervisors' children.
    What a rank starts itself (a forked checkpoint writer, DataLoader workers) carries
    the rank's environment too, but its parent is the rank, not a supervisor.

    Example:
        >>> rank_processes("no-such-job")
        {}
    """
    ranks: dict[int, int] = {}
    for pid in job_processes(job_id, attempt):
        p = _proc(pid)
        try:
            parent = p.parent() if p is not None else None
            if p is None or parent is None:
                continue
            above = parent.cmdline()
            # the parent is a supervisor (an agent's command line names the supervisor too)
            if is_agent(above) or not any("air_sdk.runtime.supervise" in c for c in above):
                continue
            rank = int(p.environ().get("RANK", "-1"))
        except (psutil.Error, ValueError):
            continue
        if rank >= 0:
            ranks[rank] = pid
    return ranks


def job_processes(job_id: str, attempt: int | None = None) -> set[int]:
    """Pids of live processes whose environment names this job (and attempt)."""
    found = set()
    for p in psutil.process_iter(["pid"]):
        if p.pid == os.getpid():
            continue
        try:
            env = p.environ()
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if env.get("AIR_JOB_ID") != job_id:
            continue
        if attempt is not None and env.get("AIR_ATTEMPT") != str(attempt):
            continue
        found.add(p.pid)
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
