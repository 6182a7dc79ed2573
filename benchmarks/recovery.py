"""Recovery: from SIGKILL of one rank to the first training step after the resume,
AIR vs `torchrun --max-restarts=3` running the same script with the same resume code,
interleaved, 2 nodes x 1 rank, gloo on CPU.

Two scripts (--script):

- `air` (default): checkpoints with `air.checkpoint` every 5 steps and resumes with
  `air.checkpoint.load` (under AIR a surviving rank also saves the step a peer died in);
- `plain`: an unmodified torchrun script that saves its own checkpoint with
  `torch.save` every 10 steps (rank 0) and `torch.load`s it at start; no `air.*` at all.

Variants, each a gateway of its own, interleaved run by run with torchrun:
AIR (this checkout, warm interpreters on), `--before PATH` (AIR from another source
tree, e.g. `git archive` of an earlier commit: before and after in one run), and
`--cold` (this AIR with `AIR_WARM_RANKS=0`: every restart starts its ranks cold).
A job's NodeRunners warm the next attempt's interpreters once a core is idle, so the
kill waits (past step 30) until they are ready (`warm_ready`, for an AIR from before
NodeRunners its gateway's warm agents): the restart of a job that has run a while. A
failure within the first seconds of an attempt restarts cold, like `--cold`.
Each gateway first runs one untimed job. Every run stops once rank 0 has made its
first step after the resume.

AIR's time is split from its event log: kill -> RESTARTING (detect + teardown),
RESTARTING -> STARTING (backoff + relaunch), STARTING -> RUNNING (launch: every rank
up), RUNNING -> restored (checkpoint load), restored -> first step. Both report which
step they resumed from next to the newest committed one.

Both are timed to rank 0's own print of its first step after the resume (the same
clock for both). For AIR the time that step's metrics event reached the gateway is
shown too (it adds the shipper's flush interval); figures before 2026-11-30 17:00
UTC used that event.

Usage: .venv/bin/python benchmarks/recovery.py --runs 5 [--script plain] [--before DIR]
(run it from outside the checkout when giving --before)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    QUIET_ENV,
    air_gateway,
    before_gateway,
    c10d_agent_cmd,
    fmt,
    free_port,
    gateway_with,
    header,
    kill_marked,
    leave_checkout,
    markdown_table,
    median,
    warm_agents,
    warm_ready,
    warm_used,
    write_result,
)

SCRIPT = """
import os, sys, time
T0 = time.time()
import torch, torch.nn.functional as F
import air_sdk.runtime as air

def phase(name, t=None):
    if os.environ.get("RANK") == "0":
        print(f"PHASE {name} {time.time() if t is None else t}", flush=True)

phase("start", T0)
phase("imported")
ctx = air.init()
phase("init")
air.checkpoint.configure(sys.argv[1], keep=2)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
phase("ddp")
optim = torch.optim.SGD(model.parameters(), lr=0.01)
state = {"model": model, "optim": optim}
step = air.checkpoint.load(state) or 0
if ctx.rank == 0:
    print(f"RESUMED {step} {time.time()}", flush=True)
while step < 100_000:  # until the benchmark stops it, after the first resumed step
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
"""

PLAIN_SCRIPT = """
import os, sys, time
T0 = time.time()
import torch, torch.distributed as dist, torch.nn.functional as F

def phase(name, t=None):
    if os.environ.get("RANK") == "0":
        print(f"PHASE {name} {time.time() if t is None else t}", flush=True)

phase("start", T0)
phase("imported")
dist.init_process_group("gloo")
phase("init")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
phase("ddp")
optim = torch.optim.SGD(model.parameters(), lr=0.01)
path = os.path.join(sys.argv[1], "ckpt.pt")
step = 0
if os.path.exists(path):
    saved = torch.load(path)
    model.load_state_dict(saved["model"])
    optim.load_state_dict(saved["optim"])
    step = saved["step"]
if rank == 0:
    print(f"RESUMED {step} {time.time()}", flush=True)
while step < 100_000:  # until the benchmark stops it, after the first resumed step
    step += 1
    x = torch.randn(64, 32)
    loss = F.mse_loss(model(x), x)
    optim.zero_grad(); loss.backward(); optim.step()
    if rank == 0:
        print(f"STEP {step} {time.time()}", flush=True)
    if step % 10 == 0 and rank == 0:
        state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    time.sleep(0.05)
"""

KILL_AT_STEP = 30
#: rank 0's milestones after the kill, in order (PHASE lines, RESUMED, the first STEP)
TIMELINE = ("start", "imported", "init", "ddp", "resumed", "first step")


def timeline(lines: list[str], t_kill: float) -> dict[str, float]:
    """Seconds from the kill to each of rank 0's milestones in `lines` (its output after
    the kill), the same for AIR and torchrun."""
    out: dict[str, float] = {}
    for x in lines:
        parts = x.split()
        if x.startswith("PHASE ") and len(parts) == 3:
            out.setdefault(parts[1], float(parts[2]) - t_kill)
        elif x.startswith("RESUMED ") and len(parts) == 3:
            out.setdefault("resumed", float(parts[2]) - t_kill)
        elif x.startswith("STEP ") and "resumed" in out and len(parts) == 3:
            out.setdefault("first step", float(parts[2]) - t_kill)
    return out


def air_gateway_cold(**kwargs: Any) -> contextlib.AbstractContextManager[tuple[Any, Any, Path]]:
    """`air_gateway` with warm interpreters off (AIR_WARM_RANKS=0): every restart
    starts its ranks cold."""
    return gateway_with({"AIR_WARM_RANKS": "0"}, **kwargs)


def warm_up(client: Any, src: Path, timeout_s: float = 180) -> None:
    """One untimed job that does nothing: the timed runs see a gateway that has run a
    job before, as launch.py's warm-up round does."""
    from air_sdk.schema import JobSpec, Resources

    client.submit(JobSpec(entrypoint="noop.py", resources=Resources(nodes=2)), workdir=src).wait(
        timeout=timeout_s
    )


def rank_pid(marker: str, rank: int, job_dir: Path | None = None) -> int | None:
    """The training process of `rank`: from the NodeRunners' records under `job_dir`
    (an AIR job: its ranks may run on warm interpreters, whose /proc environment is not
    the rank's), else the process whose environment carries the benchmark's marker."""
    import json

    import psutil

    attempts = sorted(
        (job_dir / "attempts").glob("*/nodes/*.json") if job_dir else [],
        key=lambda p: int(p.parent.parent.name),
    )
    for record in reversed(attempts):
        try:
            ranks = json.loads(record.read_text()).get("ranks", [])
        except (OSError, ValueError):
            continue
        for r in ranks:
            if r["rank"] == rank and r.get("returncode") is None and psutil.pid_exists(r["pid"]):
                return int(r["pid"])
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
    if (directory / "ckpt.pt").exists():  # the plain script's own checkpoint
        import torch

        try:
            return int(torch.load(directory / "ckpt.pt")["step"])
        except Exception:
            return None
    steps = [
        int(p.name.split("-")[1])
        for p in directory.glob("step-*")
        if (p / "manifest.json").exists() and p.name.split("-")[1].isdigit()
    ]
    return max(steps) if steps else None


def step_of(job: Any, plain: bool) -> int:
    """The job's step: its metrics (air.log), or rank 0's STEP lines (the plain script)."""
    if not plain:
        return job.snapshot().step or 0
    for line in reversed(job.logs(rank=0, attempt=1, tail=5)):
        if line.text.startswith("STEP "):
            return int(line.text.split()[1])
    return 0


def run_air(
    client, src: Path, home: Path, gateway_pid: int | None, warm: bool, plain: bool
) -> dict:
    from air_sdk.schema import JobSpec, Resources

    marker = f"air-{time.time_ns()}"
    own_ckpt = Path(tempfile.mkdtemp(prefix="air-bench-recovery-air-")) if plain else None
    job = client.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(own_ckpt) if own_ckpt else "CKPT"],
            env={"BENCH_MARKER": marker},
            resources=Resources(nodes=2),
            max_restarts=3,
            failure={"backoff_base_s": 0.0, "backoff_max_s": 0.0},
        ),
        workdir=src,
    )
    ckpt = own_ckpt or home / "jobs" / job.id / "checkpoints"
    # the script's checkpoint dir arg: AIR sets AIR_CHECKPOINT_DIR; "CKPT" means use it
    deadline = time.time() + 120
    while step_of(job, plain) < KILL_AT_STEP:
        if time.time() > deadline:
            raise RuntimeError(f"AIR job never reached step {KILL_AT_STEP}: {job.record()}")
        time.sleep(0.05 if not plain else 0.2)
    # The next attempt's warm interpreters start once a core is idle. Kill once they
    # are ready: a failure in a job that has run a while.
    t_pool = time.time()
    while warm and warm_ready(home, job.id, gateway_pid) < 2:
        if time.time() - t_pool > 120:
            break
        time.sleep(0.1)
    pool_wait = time.time() - t_pool
    newest = newest_commit(ckpt)
    pid = rank_pid(marker, 1, home / "jobs" / job.id)
    ready = warm_agents(gateway_pid)  # an AIR from before NodeRunners: its gateway's pool
    ready_count = warm_ready(home, job.id, gateway_pid) if warm else 0
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 300
    while True:  # until rank 0's first step after the resume is in the log and the events
        texts = [line.text for line in job.logs(rank=0, attempt=2)]
        resumed_at = next((i for i, t in enumerate(texts) if t.startswith("RESUMED")), None)
        stepped = resumed_at is not None and any(t.startswith("STEP ") for t in texts[resumed_at:])
        metrics = stepped and (  # the plain script logs no metrics
            plain
            or any(
                e.type.value == "metrics" and e.attempt == 2
                for e in job.events(limit=10_000).events
            )
        )
        if metrics or job.record().state.terminal or time.time() > deadline:
            break
        time.sleep(1.0)  # the figures come from printed times; poll lightly
    job.cancel()
    record = job.wait(timeout=120)
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
    lines = [line.text for line in job.logs(rank=0, attempt=2)]
    if plain:  # its own checkpoint: the step it printed
        resumed = next((int(t.split()[1]) for t in lines if t.startswith("RESUMED")), None)
    printed = [float(t.split()[2]) for t in lines if t.startswith("RESUMED")]
    first_printed = next((float(t.split()[2]) for t in lines if t.startswith("STEP ")), None)
    if printed and running:
        phases["load (printed by rank 0)"] = printed[0] - running
    if printed and first_printed:
        phases["first step (printed by rank 0)"] = first_printed - printed[0]
    # The same clock as torchrun's figure: rank 0's own print of its first step.
    total = (first_printed - t_kill) if first_printed else float("nan")
    return {
        "state": record.state.value,
        "total_s": total,
        "seen_s": (first_step - t_kill) if first_step else float("nan"),
        "phases": phases,
        "restored_after_running_s": (restored - running) if restored and running else None,
        "resumed_from": resumed,
        "newest_committed_at_kill": newest,
        "timeline": timeline(lines, t_kill),
        "pool_wait_s": pool_wait,
        "warm_ready_at_kill": ready_count,
        "warm_used": warm_used(home, job.id, 2, ready, gateway_pid),
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
    deadline = time.time() + 300
    while time.time() < deadline and all(p.poll() is None for p in procs):
        after = lines[seen:]
        resumed_at = next((i for i, x in enumerate(after) if x.startswith("RESUMED")), None)
        if resumed_at is not None and any(x.startswith("STEP ") for x in after[resumed_at:]):
            break
        time.sleep(0.1)
    for p in procs:  # the first step after the resume is all this measures
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    kill_marked(marker)
    after = lines[seen:]
    resumed = next((int(x.split()[1]) for x in after if x.startswith("RESUMED")), None)
    resumed_at = next((i for i, x in enumerate(after) if x.startswith("RESUMED")), None)
    first = None
    if resumed_at is not None:
        first = next(
            (float(x.split()[2]) for x in after[resumed_at:] if x.startswith("STEP")), None
        )
    return {
        "state": f"stopped after the first resumed step (exit {[p.returncode for p in procs]})",
        "total_s": (first - t_kill) if first else float("nan"),
        "resumed_from": resumed,
        "newest_committed_at_kill": newest,
        "timeline": timeline(after, t_kill),
    }


def phase_rows(variants: list[tuple[str, list[dict]]]) -> list[list[str]]:
    names = sorted({k for _, runs in variants for r in runs for k in r["phases"]})
    rows = [
        [
            k,
            *(
                fmt(median([r["phases"][k] for r in runs if k in r["phases"]]))
                for _, runs in variants
            ),
        ]
        for k in names
    ]
    rows.append(
        [
            "restore after every rank up",
            *(
                fmt(
                    median(
                        [
                            r["restored_after_running_s"]
                            for r in runs
                            if r["restored_after_running_s"] is not None
                        ]
                    )
                )
                for _, runs in variants
            ),
        ]
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--script",
        choices=("air", "plain"),
        default="air",
        help="air: air.checkpoint every 5 steps; plain: unmodified torchrun script, torch.save",
    )
    ap.add_argument("--before", metavar="DIR", help="also run the AIR of this source tree")
    ap.add_argument("--cold", action="store_true", help="also run AIR with AIR_WARM_RANKS=0")
    args = ap.parse_args()
    plain = args.script == "plain"
    leave_checkout()
    src = Path(tempfile.mkdtemp(prefix="air-bench-recovery-"))
    (src / "train.py").write_text(
        PLAIN_SCRIPT
        if plain
        else SCRIPT.replace(
            "air.checkpoint.configure(sys.argv[1], keep=2)",
            "air.checkpoint.configure(None if sys.argv[1] == 'CKPT' else sys.argv[1], keep=2)",
        )
    )
    (src / "noop.py").write_text("")
    names = {"air": "AIR", "before": f"AIR before ({args.before})", "cold": "AIR, AIR_WARM_RANKS=0"}
    runs: dict[str, list[dict]] = {"air": [], "before": [], "cold": []}
    torchrun_runs: list[dict] = []
    load_before = os.getloadavg()
    t0 = time.time()
    with contextlib.ExitStack() as stack:
        gateways = {"air": stack.enter_context(air_gateway())}
        if args.before:
            gateways["before"] = stack.enter_context(before_gateway(args.before))
        if args.cold:
            gateways["cold"] = stack.enter_context(air_gateway_cold())
        for client, _gw, _home in gateways.values():
            warm_up(client, src)
        for i in range(args.runs):  # interleaved: AIR, AIR before, AIR cold, torchrun, ...
            for key, (client, gw, home) in gateways.items():
                runs[key].append(run_air(client, src, home, gw.pid, key != "cold", plain))
            torchrun_runs.append(run_torchrun(src))
            print(
                f"run {i + 1}: "
                + ", ".join(
                    f"{names[k]} {fmt(runs[k][-1]['total_s'])} s"
                    f" (warm {runs[k][-1]['warm_used']}/2)"
                    for k in gateways
                )
                + f", torchrun {fmt(torchrun_runs[-1]['total_s'])} s;"
                f" load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    load_after = os.getloadavg()
    variants = [(names[k], runs[k]) for k in gateways]
    air_runs, cold_runs, before_runs = runs["air"], runs["cold"], runs["before"]
    rows = []
    for name, rs in [*variants, ("torchrun --max-restarts=3", torchrun_runs)]:
        rows.append(
            [
                name,
                fmt(median([r["total_s"] for r in rs])),
                fmt(median([r["seen_s"] for r in rs])) if "seen_s" in rs[0] else "n/a",
                ", ".join(fmt(r["total_s"]) for r in rs),
                ", ".join(f"{r['resumed_from']}/{r['newest_committed_at_kill']}" for r in rs),
            ]
        )
    print()
    what = "plain torchrun script, torch.save" if plain else "air.checkpoint"
    print(
        header(
            f"Recovery ({what}): SIGKILL of one rank to the first resumed step,"
            f" median of {args.runs}"
        )
    )
    print()
    print(
        markdown_table(
            [
                "runner",
                "median s (rank 0's first step)",
                "median s (its metrics event at the gateway)",
                "runs s",
                "resumed from / newest committed at kill",
            ],
            rows,
        )
    )
    print()
    print(
        markdown_table(
            ["AIR phase (median s)", *(name for name, _ in variants)], phase_rows(variants)
        )
    )
    print()
    every = [*variants, ("torchrun --max-restarts=3", torchrun_runs)]
    print(
        markdown_table(
            ["rank 0 after the kill (median s)", *(name for name, _ in every)],
            [
                [
                    k,
                    *(
                        fmt(median([r["timeline"][k] for r in rs if k in r["timeline"]]))
                        for _, rs in every
                    ),
                ]
                for k in TIMELINE
            ],
        )
    )
    base = median([r["total_s"] for r in torchrun_runs])
    ratio = median([r["total_s"] for r in air_runs]) / base
    ratio_cold = median([r["total_s"] for r in cold_runs]) / base if cold_runs else None
    ratio_before = median([r["total_s"] for r in before_runs]) / base if before_runs else None
    print(
        f"\nAIR / torchrun: {ratio:.2f}x"
        + (f" (before: {ratio_before:.2f}x)" if ratio_before is not None else "")
        + (f" (warm interpreters off: {ratio_cold:.2f}x)" if ratio_cold is not None else "")
        + " (goal: <= 1.0x, detection < 1 s, never an older checkpoint)."
        f" Warm at the restart: {[r['warm_used'] for r in air_runs]} of 2 nodes."
        f" Load average {load_before[0]:.1f} before, {load_after[0]:.1f} after,"
        f" {time.time() - t0:.0f} s in all."
    )
    write_result(
        "recovery" if not plain else "recovery_plain",
        {
            "runs": args.runs,
            "script": args.script,
            "before": args.before,
            "air": air_runs,
            "air_before": before_runs,
            "air_cold": cold_runs,
            "torchrun": torchrun_runs,
            "ratio": ratio,
            "ratio_before": ratio_before,
            "ratio_cold": ratio_cold,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
    )


if __name__ == "__main__":
    main()
