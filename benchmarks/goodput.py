"""Goodput under repeated failures: a 2-node x 1-rank gloo job on CPU runs for
--duration seconds with rank 1 SIGKILLed every --kill-every seconds and a checkpoint
every --ckpt-every seconds (every K steps, K from the step time), AIR (max_restarts
100, no backoff) vs bare `torchrun --max-restarts=100` running the same script with
the same air.checkpoint resume code.

Goodput = productive time / wall time. Both are computed the same way from the
script's own output: steps kept = the final step reached, productive = that step x
the median step time, wall = end - start (submit or Popen to the end of the window).
For AIR the gateway's own `job.record().goodput` is reported next to it.
The issue's full figure is 600 s with a kill every 60 s (`--duration 600 --kill-every 60`).

AIR runs as it comes (warm interpreters for restarts, and a surviving rank checkpoints
the step a peer died in: docs/failure-handling.md#a-checkpoint-at-the-failure), then,
unless --no-variants, with that failure save off (`AIR_CHECKPOINT_ON_FAILURE=0`:
restarts from the last periodic checkpoint, as torchrun does); --cold adds a run with
`AIR_WARM_RANKS=0`, and --before DIR a run of the AIR of another source tree (e.g.
`git archive` of an earlier commit). Each variant is a gateway started with that
variable in its environment (AIR_CHECKPOINT_ON_FAILURE is one ranks get from it). The
runs are sequential (each needs the 2 cores to itself), so their load differs: the
load average is recorded before and after each.

Usage: .venv/bin/python benchmarks/goodput.py --duration 180 --kill-every 45
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    QUIET_ENV,
    c10d_agent_cmd,
    fmt,
    free_port,
    gateway_with,
    header,
    kill_marked,
    leave_checkout,
    markdown_table,
    median,
    write_result,
)
from recovery import rank_pid  # noqa: E402

STEP_SLEEP_S = 0.1
ENV_ON_FAILURE = "AIR_CHECKPOINT_ON_FAILURE"

SCRIPT = f"""
import os, sys, time
import torch, torch.nn.functional as F
import air_sdk.runtime as air

ctx = air.init()
air.checkpoint.configure(None if sys.argv[1] == "CKPT" else sys.argv[1], keep=2)
every = int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
optim = torch.optim.SGD(model.parameters(), lr=0.01)
state = {{"model": model, "optim": optim}}
step = air.checkpoint.load(state) or 0
if ctx.rank == 0:
    print(f"RESUMED {{step}} {{time.time()}}", flush=True)
while step < 10_000_000:
    step += 1
    x = torch.randn(64, 32)
    loss = F.mse_loss(model(x), x)
    optim.zero_grad(); loss.backward(); optim.step()
    air.log(step=step, loss=loss.item())
    if ctx.rank == 0:
        print(f"STEP {{step}} {{time.time()}}", flush=True)
    if step % every == 0:
        air.checkpoint.save(state, step=step)
    time.sleep({STEP_SLEEP_S})
"""


def from_lines(lines: list[str], start: float, end: float) -> dict:
    """Final step, median step time (consecutive steps of one attempt) and goodput."""
    steps: list[tuple[int, float]] = []
    for x in lines:
        if x.startswith("STEP "):
            _, s, ts = x.split()
            if float(ts) <= end:
                steps.append((int(s), float(ts)))
    deltas = [b[1] - a[1] for a, b in zip(steps, steps[1:], strict=False) if b[0] == a[0] + 1]
    final = max((s for s, _ in steps), default=0)
    step_s = median(deltas)
    wall = end - start
    return {
        "final_step": final,
        "steps_run": len(steps),
        "median_step_s": step_s,
        "wall_s": wall,
        "goodput": final * step_s / wall if deltas else float("nan"),
        "resumes": [int(x.split()[1]) for x in lines if x.startswith("RESUMED")],
    }


def killer(
    find: Callable[[], int | None], start: float, duration: float, every: float, kills: list[float]
) -> None:
    """SIGKILL rank 1 (`find()`) at start + every, + 2*every, ... (waiting for it to exist)."""
    n = 1
    while start + n * every < start + duration - 1:
        while time.time() < start + n * every:
            time.sleep(0.05)
        while time.time() < start + duration:
            pid = find()
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(time.time() - start)
                    break
                except OSError:
                    pass
            time.sleep(0.1)
        n += 1


def run_air(client, home: Path, src: Path, args, every: int) -> dict:
    from air_sdk.schema import JobSpec, Resources

    marker = f"air-{time.time_ns()}"
    start = time.time()
    job = client.submit(
        JobSpec(
            entrypoint="train.py",
            args=["CKPT", str(every)],
            env={"BENCH_MARKER": marker},
            resources=Resources(nodes=2),
            max_restarts=100,
            failure={"backoff_base_s": 0.0, "backoff_max_s": 0.0},
        ),
        workdir=src,
    )
    kills: list[float] = []
    killer(
        lambda: rank_pid(marker, 1, home / "jobs" / job.id),
        start,
        args.duration,
        args.kill_every,
        kills,
    )
    while time.time() < start + args.duration:
        time.sleep(0.1)
    end = time.time()
    rec_live = job.record()  # goodput while still running, at the end of the window
    job.cancel()
    rec = job.wait(timeout=60)
    kill_marked(marker)
    attempts = job.attempts()
    lines = [ln.text for a in attempts for ln in job.logs(rank=0, attempt=a.attempt)]
    out = from_lines(lines, start, end)
    out.update(
        {
            "failure_saves": sum(c.at_failure for c in job.checkpoints().commits),
            "air_goodput_at_end": rec_live.goodput,
            "air_goodput_after_cancel": job.record().goodput,
            "attempts": len(attempts),
            "state": rec.state.value,
            "kills_at_s": kills,
            "attempt_lost_s": [a.time_lost_s for a in attempts],
        }
    )
    return out


def run_torchrun(src: Path, args, every: int) -> dict:
    marker = f"torchrun-{time.time_ns()}"
    ckpt = Path(tempfile.mkdtemp(prefix="air-bench-goodput-torchrun-"))
    port = free_port()
    env = {**os.environ, **QUIET_ENV, "BENCH_MARKER": marker}
    cmd = c10d_agent_cmd(port, marker, 100, "train.py", str(ckpt), str(every))
    start = time.time()
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

    for p in procs:
        threading.Thread(target=pump, args=(p,), daemon=True).start()
    kills: list[float] = []
    killer(lambda: rank_pid(marker, 1), start, args.duration, args.kill_every, kills)
    while time.time() < start + args.duration:
        time.sleep(0.1)
    end = time.time()
    exited = [p.poll() for p in procs]
    kill_marked(marker)
    for p in procs:
        p.wait(timeout=30)
    out = from_lines(list(lines), start, end)
    out.update({"kills_at_s": kills, "agents_exited_early": exited})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=180.0)
    ap.add_argument("--kill-every", type=float, default=45.0)
    ap.add_argument("--ckpt-every", type=float, default=10.0)
    ap.add_argument(
        "--step-s", type=float, default=0.12, help="expected step time, to turn seconds into K"
    )
    ap.add_argument(
        "--no-variants", action="store_true", help="skip AIR with AIR_CHECKPOINT_ON_FAILURE=0"
    )
    ap.add_argument("--cold", action="store_true", help="add AIR with AIR_WARM_RANKS=0")
    ap.add_argument("--before", metavar="DIR", help="add the AIR of this source tree")
    args = ap.parse_args()
    leave_checkout()
    every = max(1, round(args.ckpt_every / args.step_s))
    src = Path(tempfile.mkdtemp(prefix="air-bench-goodput-"))
    (src / "train.py").write_text(SCRIPT)
    loads: dict[str, tuple[float, float]] = {}

    def timed(name: str, fn: Callable[..., dict], *a: Any) -> dict:
        before = os.getloadavg()[0]
        out = fn(*a)
        loads[name] = (before, os.getloadavg()[0])
        print(f"{name}: goodput {fmt(out['goodput'], 3)}; load {loads[name]}", flush=True)
        return out

    variants = [("AIR", "AIR", {})]
    if not args.no_variants:
        variants.append(
            ("AIR, AIR_CHECKPOINT_ON_FAILURE=0", "AIR no failure save", {ENV_ON_FAILURE: "0"})
        )
    if args.cold:
        variants.append(("AIR, AIR_WARM_RANKS=0", "AIR cold", {"AIR_WARM_RANKS": "0"}))
    if args.before:
        tree = str(Path(args.before).resolve())
        variants.append((f"AIR before ({args.before})", "AIR before", {"PYTHONPATH": tree}))
    results: dict[str, dict] = {}
    for _name, key, env in variants:
        with gateway_with(env) as (client, _gw, home):
            results[key] = timed(key, run_air, client, home, src, args, every)
    torchrun = timed("torchrun", run_torchrun, src, args, every)
    air = results["AIR"]
    print(
        header(
            f"Goodput: {args.duration:g} s, rank 1 SIGKILLed every {args.kill_every:g} s, "
            f"checkpoint every {every} steps (~{args.ckpt_every:g} s)"
        )
    )
    print()
    rows = []
    runners = [(name, key, results[key]) for name, key, _ in variants]
    runners.append(("torchrun --max-restarts=100", "torchrun", torchrun))
    for name, key, r in runners:
        rows.append(
            [
                name,
                fmt(r["goodput"], 3),
                fmt(r.get("air_goodput_at_end"), 3) if name.startswith("AIR") else "n/a",
                r["final_step"],
                r["steps_run"],
                fmt(r["median_step_s"], 3),
                fmt(r["wall_s"], 1),
                len(r["kills_at_s"]),
                r.get("failure_saves", "n/a"),
                ", ".join(str(s) for s in r["resumes"]),
                "{:.1f} -> {:.1f}".format(*loads[key]),
            ]
        )
    print(
        markdown_table(
            [
                "runner",
                "goodput (final step x median step / wall)",
                "AIR's own goodput",
                "final step",
                "steps run",
                "median step s",
                "wall s",
                "kills",
                "saves at the failure",
                "resumed from",
                "load",
            ],
            rows,
        )
    )
    ratio = air["goodput"] / torchrun["goodput"]
    print(f"\nAIR / torchrun goodput: {ratio:.3f}x (goal: AIR >= 0.85 and above torchrun)")
    for name, key, _ in variants[1:]:
        print(f"{name} / torchrun: {results[key]['goodput'] / torchrun['goodput']:.3f}x")
    for name, key, _ in variants:
        print(f"{name}: attempts' time lost s: {results[key]['attempt_lost_s']}")
    write_result(
        "goodput",
        {
            "args": vars(args),
            "every_steps": every,
            "air": results,
            "torchrun": torchrun,
            "ratio": ratio,
            "loadavg": loads,
        },
    )


if __name__ == "__main__":
    main()
