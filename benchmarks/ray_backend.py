"""The same 2-node job on AIR's local backend, AIR's Ray backend and Ray Train's
`TorchTrainer` (FailureConfig(max_failures=3)) on one simulated Ray cluster (a head
with no CPUs and two 1-CPU nodes): launch to step 10, then SIGKILL of rank 1 at step
30 to the first step after the resume, and which checkpoint each resumed from.

Every runner trains the same model the same way (DDP Linear(32, 32), 50 ms steps, a
checkpoint every 5 steps) and rank 0 appends `STEP n wallclock` lines to a file, so
one clock and one instrument time all three. Ray Train checkpoints with
`ray.train.report(checkpoint=...)` (its way), AIR with `air.checkpoint` (ours).
Runs are interleaved (AIR-ray, Ray Train, AIR-local, ...); medians are quoted.

Needs Ray Train for the peer: .venv/bin/pip install "ray[default,train]==2.60.0" torch==2.13.0
Usage: .venv/bin/python benchmarks/ray_backend.py --runs 3   # after 1 unrecorded round
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    air_gateway,
    fmt,
    free_port,
    header,
    markdown_table,
    median,
    write_result,
)

KILL_AT_STEP = 30
TOTAL_STEPS = 45

AIR_SCRIPT = """
import os, sys, time
import torch, torch.nn.functional as F
import air_sdk.runtime as air

out = os.environ["BENCH_FILE"]
ctx = air.init()
def note(line):
    if ctx.rank == 0:
        with open(out, "a") as f:
            f.write(line + "\\n")
with open(out, "a") as f:
    f.write(f"PID {ctx.rank} {os.getpid()} {ctx.attempt}\\n")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
optim = torch.optim.SGD(model.parameters(), lr=0.01)
state = {"model": model, "optim": optim}
step = air.checkpoint.load(state) or 0
note(f"RESUMED {step} {time.time()}")
while step < TOTAL:
    step += 1
    x = torch.randn(64, 32)
    loss = F.mse_loss(model(x), x)
    optim.zero_grad(); loss.backward(); optim.step()
    air.log(step=step, loss=loss.item())
    note(f"STEP {step} {time.time()}")
    if step % 5 == 0:
        air.checkpoint.save(state, step=step)
        note(f"SAVED {step} {time.time()}")
    time.sleep(0.05)
air.checkpoint.wait()
del model
air.shutdown()
""".replace("TOTAL", str(TOTAL_STEPS))


def raytrain_loop(config: dict[str, Any]) -> None:
    """Ray Train's version of the same loop (runs inside its worker actors)."""
    import tempfile as tf

    import ray.train
    import torch
    import torch.nn.functional as F
    from ray.train import Checkpoint
    from ray.train.torch import prepare_model

    out = config["bench_file"]
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()

    def note(line: str) -> None:
        if rank == 0:
            with open(out, "a") as f:
                f.write(line + "\n")

    with open(out, "a") as f:
        f.write(f"PID {rank} {os.getpid()} 0\n")
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(32, 32))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            saved = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.module.load_state_dict(saved["model"])
        optim.load_state_dict(saved["optim"])
        step = int(saved["step"])
    note(f"RESUMED {step} {time.time()}")
    while step < config["total"]:
        step += 1
        x = torch.randn(64, 32)
        loss = F.mse_loss(model(x), x)
        optim.zero_grad()
        loss.backward()
        optim.step()
        note(f"STEP {step} {time.time()}")
        if step % 5 == 0:
            with tf.TemporaryDirectory() as d:
                if rank == 0:
                    state = {"model": model.module.state_dict(), "optim": optim.state_dict()}
                    torch.save({**state, "step": step}, os.path.join(d, "state.pt"))
                ray.train.report(
                    {"step": step, "loss": loss.item()},
                    checkpoint=Checkpoint.from_directory(d) if rank == 0 else None,
                )
            note(f"SAVED {step} {time.time()}")
        time.sleep(0.05)


def raytrain_driver(address: str, storage: str, bench_file: str) -> None:
    """`--raytrain-driver`: connect, then fit (the timer starts at fit, Ray up already)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=address, log_to_driver=False)
    trainer = TorchTrainer(
        raytrain_loop,
        train_loop_config={"bench_file": bench_file, "total": TOTAL_STEPS},
        scaling_config=ScalingConfig(
            num_workers=2,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
            placement_strategy="STRICT_SPREAD",
        ),
        run_config=RunConfig(
            storage_path=storage,
            name=f"bench-{time.time_ns()}",
            failure_config=FailureConfig(max_failures=3),
        ),
    )
    with open(bench_file, "a") as f:
        f.write(f"START {time.time()}\n")
    trainer.fit()
    with open(bench_file, "a") as f:
        f.write(f"END {time.time()}\n")


# -- measuring ---------------------------------------------------------------------------


def read(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def wait_line(path: Path, pred: Any, timeout_s: float, what: str) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for fields in read(path):
            if pred(fields):
                return fields
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what} in {path}")


def measure(path: Path, t0: float, kill_pid: Any, newest: Any, done: Any) -> dict[str, Any]:
    """Launch -> step 10; SIGKILL rank 1 at step KILL_AT_STEP -> first step after resume."""
    step10 = wait_line(path, lambda f: f[:2] == ["STEP", "10"], 300, "step 10")
    wait_line(path, lambda f: f[:2] == ["STEP", str(KILL_AT_STEP)], 300, "the kill step")
    committed = newest()
    pid = kill_pid()
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    lines = read(path)
    seen = len(lines)

    def resumed_line(f: list[str]) -> bool:
        return f[0] == "RESUMED"

    deadline = time.monotonic() + 300
    resumed = first = None
    while time.monotonic() < deadline and first is None:
        after = read(path)[seen:]
        for i, f in enumerate(after):
            if resumed_line(f):
                resumed = int(f[1])
                first = next((float(g[2]) for g in after[i:] if g[0] == "STEP"), None)
                break
        time.sleep(0.02)
    state = done()
    return {
        "to_step10_s": float(step10[2]) - t0,
        "kill_to_resumed_step_s": (first - t_kill) if first else float("nan"),
        "resumed_from": resumed,
        "newest_committed_at_kill": committed,
        "state": state,
    }


def rank_pid(path: Path, rank: int, attempt: str | None = None) -> int:
    pids = [
        int(f[2])
        for f in read(path)
        if f[0] == "PID" and f[1] == str(rank) and (attempt is None or f[3] == attempt)
    ]
    return pids[-1]


def run_air(client: Any, src: Path, storage: Path) -> dict[str, Any]:
    from air_sdk.schema import JobSpec, Resources

    bench_file = storage / f"air-{time.time_ns()}.txt"
    t0 = time.time()
    job = client.submit(
        JobSpec(
            entrypoint="train.py",
            env={"BENCH_FILE": str(bench_file)},
            resources=Resources(nodes=2),
            max_restarts=3,
            failure={"backoff_base_s": 0.0, "backoff_max_s": 0.0},
        ),
        workdir=src,
    )

    def newest() -> int:
        return max((c.step for c in job.checkpoints().commits), default=0)

    def done() -> str:
        return job.wait(timeout=300).state.value

    out = measure(bench_file, t0, lambda: rank_pid(bench_file, 1, "1"), newest, done)
    attempts = job.attempts()
    out["resumed_from"] = attempts[1].resumed_from_step if len(attempts) > 1 else None
    out["failure"] = attempts[0].failure.reason if attempts[0].failure else None
    return out


def run_raytrain(address: str, storage: Path, env: dict[str, str]) -> dict[str, Any]:
    bench_file = storage / f"raytrain-{time.time_ns()}.txt"
    driver = subprocess.Popen(
        [sys.executable, __file__, "--raytrain-driver", address, str(storage), str(bench_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        start = wait_line(bench_file, lambda f: f[0] == "START", 120, "Ray Train's fit()")

        def newest() -> int:
            return max((int(f[1]) for f in read(bench_file) if f[0] == "SAVED"), default=0)

        def done() -> str:
            return "SUCCEEDED" if driver.wait(timeout=300) == 0 else f"exit {driver.returncode}"

        return measure(bench_file, float(start[1]), lambda: rank_pid(bench_file, 1), newest, done)
    finally:
        if driver.poll() is None:
            driver.kill()


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first")
    ap.add_argument("--raytrain-driver", nargs=3, metavar=("ADDRESS", "STORAGE", "FILE"))
    args = ap.parse_args()
    if args.raytrain_driver:
        raytrain_driver(*args.raytrain_driver)
        return

    tmp = Path(tempfile.mkdtemp(prefix="airbr-", dir="/tmp"))
    (tmp / "ray").mkdir()
    storage = tmp / "shared"
    storage.mkdir()
    src = tmp / "src"
    src.mkdir()
    (src / "train.py").write_text(AIR_SCRIPT)
    os.environ.update(
        {
            "RAY_TMPDIR": str(tmp),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "AIR_RAY_STORAGE": str(storage),
            "OMP_NUM_THREADS": "1",
        }
    )
    # Imported only now: Ray reads RAY_AUTH_MODE when it loads.
    from ray.cluster_utils import Cluster

    from air_sdk.gateway.server import GatewayOptions, start_detached, stop_detached

    loads = [load_avg()]
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "gcs_server_port": free_port(),
        },
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    runs: dict[str, list[dict[str, Any]]] = {"AIR on Ray": [], "Ray Train": [], "AIR local": []}
    home = tmp / "home"
    try:
        from air_sdk.client import Client

        gw = start_detached(
            GatewayOptions(
                port=free_port(),
                home=home,
                backend="ray",
                ray_address=cluster.address,
                write_client_config=False,
            ),
            timeout_s=180,
        )
        ray_client = Client(gw.url, gw.token)
        with air_gateway() as (local_client, _gw, _home):
            for i in range(-args.warmup, args.runs):
                for name, fn in (
                    ("AIR on Ray", lambda: run_air(ray_client, src, storage)),
                    ("Ray Train", lambda: run_raytrain(cluster.address, storage, dict(os.environ))),
                    ("AIR local", lambda: run_air(local_client, src, storage)),
                ):
                    try:
                        result = fn()
                    except Exception as exc:  # a failed run is a result too
                        result = {"error": repr(exc)}
                    result["load"] = load_avg()
                    print(name, "warm-up" if i < 0 else i, json.dumps(result), flush=True)
                    if i >= 0:
                        runs[name].append(result)
    finally:
        stop_detached(home)
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    loads.append(load_avg())
    rows = []
    ray_train = runs["Ray Train"]
    for name, rs in runs.items():
        launch = median([r["to_step10_s"] for r in rs if "to_step10_s" in r])
        kill = median([r["kill_to_resumed_step_s"] for r in rs if "kill_to_resumed_step_s" in r])
        rows.append(
            [
                name,
                fmt(launch),
                ", ".join(fmt(r.get("to_step10_s")) for r in rs),
                fmt(kill),
                ", ".join(fmt(r.get("kill_to_resumed_step_s")) for r in rs),
                ", ".join(
                    f"{r.get('resumed_from')}/{r.get('newest_committed_at_kill')}" for r in rs
                ),
            ]
        )
    base_launch = median([r["to_step10_s"] for r in ray_train if "to_step10_s" in r])
    base_kill = median(
        [r["kill_to_resumed_step_s"] for r in ray_train if "kill_to_resumed_step_s" in r]
    )
    print(header(f"Ray: launch to step 10 and kill to resumed step, median of {args.runs}"))
    print()
    print(
        markdown_table(
            [
                "runner",
                "launch -> step 10 (s)",
                "runs",
                "kill -> resumed step (s)",
                "runs",
                "resumed from / newest committed at kill",
            ],
            rows,
        )
    )
    for name in ("AIR on Ray", "AIR local"):
        rs = runs[name]
        lm = median([r["to_step10_s"] for r in rs if "to_step10_s" in r])
        km = median([r["kill_to_resumed_step_s"] for r in rs if "kill_to_resumed_step_s" in r])
        print(
            f"{name} vs Ray Train: launch {lm / base_launch:.2f}x, recovery {km / base_kill:.2f}x"
        )
    print(f"load average (1, 5, 15 min) before {loads[0]}, after {loads[-1]}")
    write_result("ray_backend", {"runs": runs, "load_before": loads[0], "load_after": loads[-1]})


if __name__ == "__main__":
    main()
