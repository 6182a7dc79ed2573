"""Recovery: from SIGKILL of one rank to the first training step after the resume,
AIR vs `torchrun --max-restarts=3` running the same script with the same resume code
(air.checkpoint every 5 steps), interleaved, 2 nodes x 1 rank, gloo on CPU.

AIR's time is split from its event log: kill -> RESTARTING (detect + teardown),
RESTARTING -> STARTING (backoff + relaunch), STARTING -> RUNNING (launch +
rendezvous: every rank up), RUNNING -> restored (checkpoint load), restored -> first
step. Both report which step they resumed from next to the newest committed one.

Usage: .venv/bin/python benchmarks/recovery.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    QUIET_ENV,
    air_gateway,
    c10d_agent_cmd,
    fmt,
    free_port,
    header,
    markdown_table,
    median,
    write_result,
)

SCRIPT = """
import os, sys, time
import torch, torch.nn.functional as F
import air_sdk.runtime as air

ctx = air.init()
air.checkpoint.configure(sys.argv[1], keep=2)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
optim = torch.optim.SGD(model.parameters(), lr=0.01)
state = {"model": model, "optim": optim}
step = air.checkpoint.load(state) or 0
if ctx.rank == 0:
    print(f"RESUMED {step} {time.time()}", flush=True)
while step < 400:
    step += 1
    x = torch.randn(64, 32)
    loss = F.mse_loss(model(x), x)
    optim.zero_grad(); loss.backward(); optim.step()
    air.log(step=step, loss=loss.item())
    if ctx.rank == 0:
        print(f"STEP {step} {time.time()}", flush=True)
    if step % 5 == 0:
        air.checkpoint.save(state, step=step)
    time.sleep(0.05)
air.checkpoint.wait()
del model
air.shutdown()
"""

KILL_AT_STEP = 30


def rank_pid(marker: str, rank: int) -> int | None:
    import psutil

    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if env.get("BENCH_MARKER") != marker or env.get("RANK") != str(rank):
            continue
        if any(
            "torch.distributed.run" in c or "air_sdk._agent" in c or "supervise" in c for c in cmd
        ):
            continue
        if any(c.endswith("train.py") for c in cmd):
            return p.pid
    return None


def newest_commit(directory: Path) -> int | None:
    steps = [
        int(p.name.split("-")[1])
        for p in directory.glob("step-*")
        if (p / "manifest.json").exists() and p.name.split("-")[1].isdigit()
    ]
    return max(steps) if steps else None


def run_air(client, src: Path, home: Path) -> dict:
    from air_sdk.schema import JobSpec, Resources

    marker = f"air-{time.time_ns()}"
    job = client.submit(
        JobSpec(
            entrypoint="train.py",
            args=["CKPT"],
            env={"BENCH_MARKER": marker},
            resources=Resources(nodes=2),
            max_restarts=3,
            failure={"backoff_base_s": 0.0, "backoff_max_s": 0.0},
        ),
        workdir=src,
    )
    ckpt = home / "jobs" / job.id / "checkpoints"
    # the script's checkpoint dir arg: AIR sets AIR_CHECKPOINT_DIR; "CKPT" means use it
    deadline = time.time() + 120
    while (job.snapshot().step or 0) < KILL_AT_STEP:
        if time.time() > deadline:
            raise RuntimeError(f"AIR job never reached step {KILL_AT_STEP}: {job.record()}")
        time.sleep(0.05)
    newest = newest_commit(ckpt)
    pid = rank_pid(marker, 1)
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    record = job.wait(timeout=300)
    events = job.events(limit=10_000).events
    phases: dict[str, float] = {}
    restarting = next(
        e.ts for e in events if e.type.value == "state" and e.data["state"] == "RESTARTING"
    )
    starting = next(
        e.ts
        for e in events
        if e.type.value == "state" and e.data["state"] == "STARTING" and e.ts > restarting
    )
    running = next(
        (
            e.ts
            for e in events
            if e.type.value == "state" and e.data["state"] == "RUNNING" and e.ts > starting
        ),
        None,
    )
    restored = next(
        (
            e.ts
            for e in events
            if e.type.value == "checkpoint" and e.data.get("restored") and e.ts > starting
        ),
        None,
    )
    first_step = next((e.ts for e in events if e.type.value == "metrics" and e.attempt == 2), None)
    phases["detect+teardown"] = restarting - t_kill
    phases["backoff+relaunch"] = starting - restarting
    if running:
        phases["launch+rendezvous"] = running - starting
    resumed = job.attempts()[1].resumed_from_step
    printed = [
        float(line.text.split()[2])
        for line in job.logs(rank=0, attempt=2)
        if line.text.startswith("RESUMED")
    ]
    if printed and running:
        phases["load (printed by rank 0)"] = printed[0] - running
    total = (first_step - t_kill) if first_step else float("nan")
    return {
        "state": record.state.value,
        "total_s": total,
        "phases": phases,
        "restored_after_running_s": (restored - running) if restored and running else None,
        "resumed_from": resumed,
        "newest_committed_at_kill": newest,
    }


def run_torchrun(src: Path) -> dict:
    marker = f"torchrun-{time.time_ns()}"
    ckpt = Path(tempfile.mkdtemp(prefix="air-bench-recovery-torchrun-"))
    port = free_port()
    env = {**os.environ, **QUIET_ENV, "BENCH_MARKER": marker}
    cmd = c10d_agent_cmd(port, marker, 3, "train.py", str(ckpt))
    procs = [
        subprocess.Popen(
            cmd, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for _ in range(2)
    ]
    lines: list[str] = []

    def pump(p: subprocess.Popen) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line.strip())

    threads = [threading.Thread(target=pump, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    deadline = time.time() + 120
    while not any(line.startswith(f"STEP {KILL_AT_STEP} ") for line in lines):
        if time.time() > deadline:
            raise RuntimeError("torchrun never reached the kill step")
        time.sleep(0.05)
    newest = newest_commit(ckpt)
    seen = len(lines)
    t_kill = time.time()
    os.kill(rank_pid(marker, 1), signal.SIGKILL)
    for p in procs:
        p.wait(timeout=300)
    after = lines[seen:]
    resumed = next((int(x.split()[1]) for x in after if x.startswith("RESUMED")), None)
    resumed_at = next((i for i, x in enumerate(after) if x.startswith("RESUMED")), None)
    first = None
    if resumed_at is not None:
        first = next(
            (float(x.split()[2]) for x in after[resumed_at:] if x.startswith("STEP")), None
        )
    return {
        "state": "SUCCEEDED"
        if all(p.returncode == 0 for p in procs)
        else f"exit {[p.returncode for p in procs]}",
        "total_s": (first - t_kill) if first else float("nan"),
        "resumed_from": resumed,
        "newest_committed_at_kill": newest,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    src = Path(tempfile.mkdtemp(prefix="air-bench-recovery-"))
    (src / "train.py").write_text(
        SCRIPT.replace(
            "air.checkpoint.configure(sys.argv[1], keep=2)",
            "air.checkpoint.configure(None if sys.argv[1] == 'CKPT' else sys.argv[1], keep=2)",
        )
    )
    air_runs, torchrun_runs = [], []
    with air_gateway() as (client, _gw, home):
        for _ in range(args.runs):
            air_runs.append(run_air(client, src, home))
            torchrun_runs.append(run_torchrun(src))
    rows = []
    for name, runs in (("AIR", air_runs), ("torchrun --max-restarts=3", torchrun_runs)):
        rows.append(
            [
                name,
                fmt(median([r["total_s"] for r in runs])),
                ", ".join(fmt(r["total_s"]) for r in runs),
                ", ".join(f"{r['resumed_from']}/{r['newest_committed_at_kill']}" for r in runs),
            ]
        )
    print(header(f"Recovery: SIGKILL of one rank to the first resumed step, median of {args.runs}"))
    print()
    print(
        markdown_table(
            ["runner", "median s", "runs s", "resumed from / newest committed at kill"], rows
        )
    )
    phase_names = sorted({k for r in air_runs for k in r["phases"]})
    print()
    print(
        markdown_table(
            ["AIR phase", "median s"],
            [
                [k, fmt(median([r["phases"][k] for r in air_runs if k in r["phases"]]))]
                for k in phase_names
            ]
            + [
                [
                    "restore after every rank up",
                    fmt(
                        median(
                            [
                                r["restored_after_running_s"]
                                for r in air_runs
                                if r["restored_after_running_s"] is not None
                            ]
                        )
                    ),
                ]
            ],
        )
    )
    ratio = median([r["total_s"] for r in air_runs]) / median([r["total_s"] for r in torchrun_runs])
    print(
        f"\nAIR / torchrun: {ratio:.2f}x (goal: <= 1.0x, detection < 1 s, never an older checkpoint)"
    )
    write_result(
        "recovery", {"runs": args.runs, "air": air_runs, "torchrun": torchrun_runs, "ratio": ratio}
    )


if __name__ == "__main__":
    main()
