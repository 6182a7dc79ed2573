"""The operator's node health probe: a command the runner runs on each node
(`air gateway start --node-probe CMD`, every `--node-probe-interval-s` and at once
on a node a job just failed on). A failure is `probe` evidence, enough alone to
leave the node out of placements (`NodeHealthPolicy`); a pass forgets the node's
crash and probe evidence, so it returns to placements.

`--node-probe builtin` is a cheap probe of AIR's own: the node can start a Python
process and, when it has GPUs, NVML answers for each of them. Any other value is a
command line (split like a shell would, never run by one), started with the node's
`AIR_NODE_NAME` and `CUDA_VISIBLE_DEVICES`; exit status 0 is a pass.

Example:
    >>> probe_argv("builtin")[1:3]
    ['-I', '-c']
    >>> probe_argv("/opt/checks/node-ok --quick")
    ['/opt/checks/node-ok', '--quick']
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from air_sdk.runner.node.env import allowed_env
from air_sdk.runner.node_health import NodeHealthBook
from air_sdk.runner.policy import NodeEvidence
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import NodeProbe, WorkerEnv

__all__ = ["BUILTIN", "PROBE_TIMEOUT_S", "NodeProber", "probe_argv", "run_probe"]

log = logging.getLogger(__name__)

#: the value of --node-probe that runs AIR's own probe
BUILTIN = "builtin"
#: a probe that has not ended by then failed
PROBE_TIMEOUT_S = 30.0
#: output lines of a failed probe kept in its detail
TAIL_LINES = 5

_BUILTIN_SCRIPT = """
import os, sys
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
if visible:
    import pynvml
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        for d in visible:
            if d.isdigit() and int(d) >= count:
                sys.exit(f"GPU {d} is not among the {count} NVML sees")
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(d))
            pynvml.nvmlDeviceGetMemoryInfo(handle)
    finally:
        pynvml.nvmlShutdown()
print("ok", len(visible), "GPUs")
"""


def probe_argv(command: str) -> list[str]:
    """The argv of `--node-probe COMMAND` (`builtin`: AIR's own probe)."""
    if command == BUILTIN:
        return [sys.executable, "-I", "-c", _BUILTIN_SCRIPT]
    argv = shlex.split(command)
    if not argv:
        raise ValueError("--node-probe is empty: give a command, or 'builtin'")
    return argv


def run_probe(argv: Sequence[str], node: NodeSpec, timeout_s: float = PROBE_TIMEOUT_S) -> NodeProbe:
    """Run the probe for `node` on this machine (a local virtual node) and judge it."""
    env = allowed_env(os.environ)
    env[WorkerEnv.env_name("node_name")] = node.name
    env[WorkerEnv.env_name("cuda_visible_devices")] = ",".join(str(g) for g in node.gpus)
    try:
        done = subprocess.run(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return NodeProbe(ok=False, at=time.time(), detail=f"no answer within {timeout_s:g} s")
    except OSError as exc:
        return NodeProbe(ok=False, at=time.time(), detail=f"could not start: {exc}")
    if done.returncode == 0:
        return NodeProbe(ok=True, at=time.time())
    tail = (done.stdout + done.stderr).strip().splitlines()[-TAIL_LINES:]
    detail = f"exit status {done.returncode}" + (": " + " | ".join(tail) if tail else "")
    return NodeProbe(ok=False, at=time.time(), detail=detail[:1000])


class NodeProber:
    """Runs the probe on every node of `nodes()` every `interval_s` (a daemon thread),
    and on one node at once when asked (`probe_now`, after a job failed there); keeps
    each node's last result and turns it into evidence in `book`.

    Example:
        >>> prober = NodeProber(["true"], 60.0, lambda: [NodeSpec("n0", 1)], NodeHealthBook())
        >>> prober.probe_now("n0").ok, prober.results()["n0"].ok
        (True, True)
    """

    def __init__(
        self,
        argv: Sequence[str],
        interval_s: float,
        nodes: Callable[[], list[NodeSpec]],
        book: NodeHealthBook,
        *,
        on_change: Callable[[], None] = lambda: None,
        run: Callable[[Sequence[str], NodeSpec], NodeProbe] = run_probe,
    ) -> None:
        self.argv = list(argv)
        self.interval_s = interval_s
        self._nodes = nodes
        self._book = book
        self._on_change = on_change
        self._run = run
        self._results: dict[str, NodeProbe] = {}
        self._lock = threading.Lock()
        #: one probe per node at a time (the loop and a failed job's controller)
        self._node_locks: dict[str, threading.Lock] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="air-node-probe", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def results(self) -> dict[str, NodeProbe]:
        """node -> its last probe's result."""
        with self._lock:
            return dict(self._results)

    def forget(self, name: str) -> None:
        """An admin vouches for node `name`: its last result goes (the next probe judges)."""
        with self._lock:
            self._results.pop(name, None)

    def failing(self) -> set[str]:
        """Nodes whose last probe failed: out of placements until one passes."""
        with self._lock:
            return {name for name, r in self._results.items() if not r.ok}

    def probe_now(self, name: str) -> NodeProbe | None:
        """Probe node `name` now and record the result (None: no such node)."""
        node = next((n for n in self._nodes() if n.name == name), None)
        if node is None:
            return None
        with self._lock:
            node_lock = self._node_locks.setdefault(name, threading.Lock())
        with node_lock:
            result = self._run(self.argv, node)
            with self._lock:
                before = self._results.get(name)
                self._results[name] = result
        if result.ok:
            self._book.probe_passed(name)
        else:
            self._book.add(NodeEvidence(name, "probe", "", "", result.at))
            if before is None or before.ok:
                log.warning("node %s failed its health probe: %s", name, result.detail)
        if before is None or before.ok != result.ok:
            self._on_change()
        return result

    def _loop(self) -> None:
        while not self._stop.is_set():
            for node in self._nodes():
                if self._stop.is_set():
                    return
                try:
                    self.probe_now(node.name)
                except Exception:  # one bad round must not end the probing
                    log.exception("probing node %s failed", node.name)
            self._stop.wait(self.interval_s)
