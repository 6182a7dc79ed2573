"""Shared helpers for the benchmarks: statistics, markdown tables, result files,
and a real AIR gateway in a temporary home.

Benchmarks are measurements, not tests: nothing here asserts a timing.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: env for every local multi-process run, AIR's or a peer's (see ARCHITECTURE.md pitfalls)
QUIET_ENV = {
    "OMP_NUM_THREADS": "1",
    "GLOO_SOCKET_IFNAME": "lo",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    "PYTHONUNBUFFERED": "1",
}


def c10d_agent_cmd(port: int, rdzv_id: str, max_restarts: int, *script: str) -> list[str]:
    """One bare torchrun c10d agent on 127.0.0.1, started the way AIR's local backend
    starts its agents; run it once per node (the peer in the restart benchmarks)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={rdzv_id}",
        "--local-addr=127.0.0.1",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
        *script,
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017 (3.10)


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """benchmarks/results/<name>.json with the date and machine added."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    body = {"benchmark": name, "date": now_iso(), "machine": machine_info(), **payload}
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    return path


def header(title: str) -> str:
    m = machine_info()
    return f"## {title}\n\n{now_iso()}; {m['cores']} cores ({m['cpu']}), Python {m['python']}"


@contextmanager
def air_gateway(
    num_nodes: int = 2,
    slots_per_node: int = 1,
    home: Path | None = None,
    **options: Any,
) -> Iterator[tuple[Any, Any, Path]]:
    """A real detached gateway (subprocess, free port, temporary home); `options` are
    more `GatewayOptions` fields.

    Yields (Client, GatewayProcess, home); stops the gateway and removes the home after.
    """
    from air_sdk.client import Client
    from air_sdk.gateway.server import GatewayOptions, start_detached, stop_detached

    own_home = home is None
    home = Path(tempfile.mkdtemp(prefix="air-bench-")) if home is None else home
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=num_nodes,
        slots_per_node=slots_per_node,
        write_client_config=False,
        # the benchmarks' jobs write their results to the host's temporary directory,
        # which a sandboxed rank's private /tmp would hide (the home stays hidden)
        sandbox_binds=[Path(tempfile.gettempdir())],
        **options,
    )
    gw = start_detached(opts)
    client = Client(gw.url, gw.token)
    try:
        yield client, gw, home
    finally:
        # A stopped gateway leaves its jobs running (the next one re-attaches): cancel
        # what a failed run left, so nothing of it outlives the benchmark.
        try:
            for record in client.jobs(limit=1000):
                if not record.state.terminal:
                    client.job(record.id).cancel()
                    client.job(record.id).wait(timeout=60)
        except Exception as exc:
            print(f"warning: could not cancel the benchmark's jobs: {exc}", flush=True)
        client.close()
        stop_detached(home)
        if own_home:
            shutil.rmtree(home, ignore_errors=True)


@contextmanager
def gateway_with(env: dict[str, str], **kwargs: Any) -> Iterator[tuple[Any, Any, Path]]:
    """`air_gateway(**kwargs)` started with `env` added to its environment (the gateway
    reads AIR_* settings when it starts, and its ranks inherit the rest)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with air_gateway(**kwargs) as value:
            yield value
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def kill_marked(marker: str) -> None:
    """SIGKILL every process a benchmark started for `marker` that is still left (found
    by its BENCH_MARKER environment variable)."""
    import psutil

    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("BENCH_MARKER") == marker:
                p.kill()
        except psutil.Error:
            continue


def bench_dir(prefix: str, files: Sequence[Path] = ()) -> Path:
    """A fresh directory to bundle as a job's code, holding copies of `files`."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    for f in files:
        shutil.copy2(f, root / f.name)
    return root


def python() -> str:
    return sys.executable


def before_gateway(tree: Path | str, **kwargs: Any) -> Any:
    """`air_gateway(**kwargs)` running the AIR of another source tree (`tree`, e.g. a
    `git archive` of an earlier commit): its gateway, launchers and ranks import
    `air_sdk` from there (PYTHONPATH; run the benchmark from outside this checkout, or
    the current directory's `air_sdk` wins), so before and after come from one run."""
    return gateway_with({"PYTHONPATH": str(Path(tree).resolve())}, **kwargs)


def leave_checkout() -> None:
    """Run from a temporary directory: `python -m air_sdk...` started here must import
    the installed (or PYTHONPATH's) `air_sdk`, not one in the current directory."""
    os.chdir(tempfile.gettempdir())


def warm_ready(home: Path, job_id: str, gateway_pid: int | None) -> int:
    """Warm interpreters ready for `job_id`'s next attempt (its NodeRunners' records);
    for an AIR from before NodeRunners, the gateway's ready warm agents."""
    nodes = home / "jobs" / job_id / "nodes"
    if nodes.is_dir():
        ready = 0
        for record in nodes.glob("*/runner.json"):
            try:
                ready += int(json.loads(record.read_text()).get("warm_ready", 0))
            except (OSError, ValueError):
                continue
        return ready
    return len(warm_agents(gateway_pid))


def warm_agents(gateway_pid: int | None) -> set[int]:
    """An AIR from before NodeRunners: the gateway's idle warm agents that finished
    their imports."""
    import psutil

    if gateway_pid is None:
        return set()
    found = set()
    try:
        children = psutil.Process(gateway_pid).children()
    except psutil.Error:
        return found
    for c in children:
        try:
            cmd = c.cmdline()
        except psutil.Error:
            continue
        if "air-warm-agent" in cmd and "ready" in cmd:
            found.add(c.pid)
    return found


def warm_used(
    home: Path, job_id: str, attempt: int, agents_before: set[int], gateway_pid: Any
) -> int:
    """How many nodes of `attempt` started on warm processes: ranks on warm interpreters
    (NodeRunners' records), or, before NodeRunners, warm agents taken from the pool."""
    records = sorted((home / "jobs" / job_id / "attempts" / str(attempt) / "nodes").glob("*.json"))
    if records:
        used = 0
        for record in records:
            try:
                ranks = json.loads(record.read_text()).get("ranks", [])
            except (OSError, ValueError):
                continue
            used += bool(ranks) and all(r.get("warm") for r in ranks)
        return used
    return len(agents_before - warm_agents(gateway_pid))
