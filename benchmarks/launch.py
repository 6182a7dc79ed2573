"""Launch latency: wall time from submit to step 10 of a 2-node x 1-rank gloo DDP job.

The same tiny DDP script runs three ways, interleaved run by run:

- AIR: `client.submit_script(...)` to a real gateway (2 virtual nodes x 1 slot),
  timed until the job's event stream shows a metrics point with step >= 10
  (what a user watching the job sees), and until SUCCEEDED;
- torchrun c10d: two bare `python -m torch.distributed.run` c10d agents, as the
  local backend starts them, timed until rank 0 prints "step 10" on stdout;
- torchrun --standalone --nproc-per-node=2, for reference;
- with `--before DIR`, AIR from another source tree (e.g. `git archive` of an earlier
  commit) on a gateway of its own: before and after in one run;
- with `--cold`, AIR on a gateway started with `AIR_WARM_RANKS=0`.

A job's first launch starts its ranks cold (warm interpreters serve a job's restarts);
the untimed warm-up round runs each launcher once first.

Rank 0 also prints the wall-clock time at which it reached step 10, so the
launch part (submit -> step 10 in the worker) can be told apart from the
reporting part (worker -> client).

    .venv/bin/python benchmarks/launch.py --runs 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    QUIET_ENV,
    air_gateway,
    before_gateway,
    bench_dir,
    fmt,
    free_port,
    header,
    leave_checkout,
    markdown_table,
    median,
    write_result,
)
from recovery import air_gateway_cold  # noqa: E402

GOAL_RATIO = 1.10
STEP = 10
TIMEOUT_S = 120.0

TRAIN_SCRIPT = '''\
"""Tiny 2-rank DDP job: rank 0 prints "step 10" (with its wall clock) in every launcher."""
import os
import time

T_START = time.time()
IS_RANK0 = os.environ.get("RANK") == "0"


def phase(name, t=None):
    if IS_RANK0:
        print(f"bench phase={name} t={time.time() if t is None else t:.6f}", flush=True)


import argparse
import gc

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import air_sdk.runtime as air


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-sleep", type=float, default=0.05)
    a = p.parse_args()
    phase("start", T_START)
    phase("imported")
    torch.set_num_threads(1)
    ctx = air.init(timeout_s=120)  # init_process_group("gloo") under any launcher
    phase("init")
    in_air = bool(os.environ.get("AIR_JOB_ID"))
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    phase("ddp")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for step in range(1, a.steps + 1):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if in_air:
            air.log(step=step, loss=loss.item())
        if ctx.rank == 0 and step == 10:
            print(f"step 10 t={time.time():.6f}", flush=True)
        time.sleep(a.step_sleep)  # training goes on after step 10, as it would
    del model, opt
    gc.collect()
    air.shutdown()


if __name__ == "__main__":
    main()
'''

_STEP_LINE = re.compile(r"step 10 t=([0-9.]+)")
_PHASE_LINE = re.compile(r"bench phase=(\w+) t=([0-9.]+)")
PHASES = ("start", "imported", "init", "ddp")


def _note_phases(line: str, wall0: float, out: dict[str, Any]) -> None:
    m = _PHASE_LINE.search(line)
    if m:
        out.setdefault(f"worker_{m.group(1)}_s", float(m.group(2)) - wall0)


def _bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIR_")}
    env.update(QUIET_ENV)
    return env


def _cpu_s(pid: int | None) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except (psutil.Error, ValueError):
        return float("nan")


def run_air(
    client: Any, code_dir: Path, script_args: list[str], gateway_pid: int | None = None
) -> dict[str, Any]:
    """One AIR run: submit, follow the event stream, note when each milestone shows."""
    from air_sdk.schema.events import EventType

    out: dict[str, Any] = {}
    cpu0 = _cpu_s(gateway_pid)
    wall0 = time.time()
    t0 = time.perf_counter()
    job = client.submit_script(
        code_dir / "train_tiny.py",
        nodes=2,
        procs_per_node=1,
        args=script_args,
        name="bench-launch",
        workdir=code_dir,
    )
    out["submit_returned_s"] = time.perf_counter() - t0
    out["job_id"] = job.id
    watchdog = threading.Timer(TIMEOUT_S, job.cancel)
    watchdog.daemon = True
    watchdog.start()
    state = None
    try:
        for ev in job.follow():
            now = time.perf_counter() - t0
            if ev.type is EventType.STATE:
                state = ev.data.get("state")
                out.setdefault(f"{state.lower()}_s", now)
            elif ev.type is EventType.METRICS and "metric_step10_s" not in out:
                if any(p.get("step", 0) >= STEP for p in ev.data.get("points", [])):
                    out["metric_step10_s"] = now
            elif ev.type is EventType.LOG:
                for line in ev.data.get("lines", []):
                    _note_phases(line, wall0, out)
                    m = _STEP_LINE.search(line)
                    if m and "log_step10_s" not in out:
                        out["log_step10_s"] = now
                        out["worker_step10_s"] = float(m.group(1)) - wall0
                        break
    finally:
        watchdog.cancel()
    out["gateway_cpu_s"] = _cpu_s(gateway_pid) - cpu0
    out["final_state"] = state
    out["end_s"] = out.get("succeeded_s", time.perf_counter() - t0)
    out["ok"] = state == "SUCCEEDED" and "metric_step10_s" in out
    out["seen_s"] = out.get("metric_step10_s")
    return out


def run_torchrun(code_dir: Path, script_args: list[str], standalone: bool) -> dict[str, Any]:
    """One bare-torchrun run: two c10d agents (or one --standalone), reading their pipes."""
    py = sys.executable
    script = str(code_dir / "train_tiny.py")
    if standalone:
        cmds = [
            [
                py,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                "--monitor-interval=0.1",
                script,
                *script_args,
            ]
        ]
    else:
        port = free_port()
        rdzv_id = f"bench-{port}"
        cmds = [
            [
                py,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={rdzv_id}",
                "--local-addr=127.0.0.1",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                script,
                *script_args,
            ]
            for _ in range(2)
        ]
    out: dict[str, Any] = {}
    lock = threading.Lock()
    wall0 = time.time()
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            cmd,
            cwd=code_dir,
            env=_bare_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for cmd in cmds
    ]
    tails: list[list[str]] = [[] for _ in procs]

    def pump(i: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            tails[i] = (tails[i] + [line.rstrip()])[-20:]
            m = _STEP_LINE.search(line)
            with lock:
                _note_phases(line, wall0, out)
            if m:
                with lock:
                    if "seen_s" not in out:
                        out["seen_s"] = time.perf_counter() - t0
                        out["worker_step10_s"] = float(m.group(1)) - wall0

    readers = [threading.Thread(target=pump, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for r in readers:
        r.start()
    deadline = time.monotonic() + TIMEOUT_S
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, 9)
                except ProcessLookupError:
                    pass
            codes.append(p.wait())
    out["end_s"] = time.perf_counter() - t0
    for r in readers:
        r.join(5)
    out["exit_codes"] = codes
    out["ok"] = all(c == 0 for c in codes) and "seen_s" in out
    if not out["ok"]:
        out["tail"] = tails
    return out


KINDS = ("air", "torchrun-c10d", "torchrun-standalone", "air-before", "air-cold")


def run_one(
    kind: str,
    gateways: dict[str, tuple[Any, Any]],
    code_dir: Path,
    script_args: list[str],
) -> dict[str, Any]:
    if kind in gateways:
        client, gw = gateways[kind]
        return run_air(client, code_dir, script_args, gw.pid)
    return run_torchrun(code_dir, script_args, standalone=kind == "torchrun-standalone")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs of each launcher")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each first")
    p.add_argument("--steps", type=int, default=30, help="training steps (>= 10)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of training after step 10 (sets --steps from 50 ms steps)",
    )
    p.add_argument("--before", metavar="DIR", help="also run the AIR of this source tree")
    p.add_argument("--cold", action="store_true", help="also run AIR with AIR_WARM_RANKS=0")
    a = p.parse_args(argv)
    leave_checkout()
    skip = {"air-before"} if not a.before else set()
    if not a.cold:
        skip.add("air-cold")
    kinds = tuple(k for k in KINDS if k not in skip)
    step_sleep = 0.05
    steps = max(a.steps, STEP) if a.duration is None else STEP + int(a.duration / step_sleep)
    script_args = ["--steps", str(steps), "--step-sleep", str(step_sleep)]
    code_dir = bench_dir("air-bench-launch-")
    (code_dir / "train_tiny.py").write_text(TRAIN_SCRIPT)

    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        client, gw, _home = stack.enter_context(air_gateway(num_nodes=2, slots_per_node=1))
        gateways = {"air": (client, gw)}
        if "air-before" in kinds:
            c3, gw3, _ = stack.enter_context(
                before_gateway(a.before, num_nodes=2, slots_per_node=1)
            )
            gateways["air-before"] = (c3, gw3)
        if "air-cold" in kinds:
            c2, gw2, _ = stack.enter_context(air_gateway_cold(num_nodes=2, slots_per_node=1))
            gateways["air-cold"] = (c2, gw2)
        for i in range(a.warmup + a.runs):
            for kind in kinds:  # interleaved: AIR, c10d, standalone, AIR before, AIR, ...
                r = run_one(kind, gateways, code_dir, script_args)
                tag = "warmup" if i < a.warmup else f"run {i - a.warmup + 1}"
                print(
                    f"{tag:>8} {kind:<20} step10 seen {fmt(r.get('seen_s'))} s,"
                    f" end {fmt(r.get('end_s'))} s{'' if r['ok'] else '  FAILED'}",
                    flush=True,
                )
                if i >= a.warmup:
                    runs[kind].append(r)

    summary: dict[str, dict[str, float]] = {}
    for kind, rs in runs.items():
        good = [r for r in rs if r["ok"]]
        summary[kind] = {
            **{
                f"worker_{ph}_s": median(
                    [r[f"worker_{ph}_s"] for r in good if f"worker_{ph}_s" in r]
                )
                for ph in PHASES
            },
            "ok_runs": len(good),
            "seen_s": median([r["seen_s"] for r in good]),
            "worker_step10_s": median(
                [r["worker_step10_s"] for r in good if "worker_step10_s" in r]
            ),
            "end_s": median([r["end_s"] for r in good]),
        }
    for kind in ("air", "air-before", "air-cold"):
        if kind not in runs:
            continue
        air_runs = [r for r in runs.get(kind, []) if r["ok"]]
        for key in (
            "submit_returned_s",
            "starting_s",
            "running_s",
            "log_step10_s",
            "gateway_cpu_s",
        ):
            summary[kind][key] = median([r[key] for r in air_runs if key in r])
    base = summary["torchrun-c10d"]
    ratio = summary["air"]["seen_s"] / base["seen_s"] if base["seen_s"] else float("nan")
    ratio_worker = (
        summary["air"]["worker_step10_s"] / base["worker_step10_s"]
        if base["worker_step10_s"]
        else float("nan")
    )

    rows = []
    labels = {
        "air": "AIR (submit -> metrics event step 10)",
        "torchrun-c10d": "torchrun c10d, 2 agents (-> stdout)",
        "torchrun-standalone": "torchrun --standalone (-> stdout)",
        "air-before": f"AIR before ({a.before})",
        "air-cold": "AIR, AIR_WARM_RANKS=0",
    }
    for kind in kinds:
        s = summary[kind]
        each = ", ".join(fmt(r.get("seen_s")) if r["ok"] else "fail" for r in runs[kind])
        rows.append(
            [
                labels[kind],
                fmt(s["seen_s"]),
                fmt(s["worker_step10_s"]),
                fmt(s["end_s"]),
                fmt(s["seen_s"] / base["seen_s"], 3) + "x",
                each,
            ]
        )
    print()
    print(header(f"Launch: submit to step {STEP}, 2 nodes x 1 rank, gloo"))
    print()
    print(
        markdown_table(
            [
                "launcher",
                "median to step 10 seen (s)",
                "median to step 10 in worker (s)",
                "median to end (s)",
                "vs c10d",
                "each run (s)",
            ],
            rows,
        )
    )
    print()
    air = summary["air"]
    phase_rows = []
    for kind in kinds:
        s = summary[kind]
        marks = [s[f"worker_{ph}_s"] for ph in PHASES] + [s["worker_step10_s"], s["seen_s"]]
        steps_ = [marks[0]] + [b - a_ for a_, b in zip(marks, marks[1:], strict=False)]
        phase_rows.append([labels[kind], *(fmt(v) for v in steps_)])
    print(
        markdown_table(
            [
                "launcher (median s)",
                "launch -> script starts",
                "imports (torch, air)",
                "init_process_group",
                "DDP()",
                "-> step 10",
                "step 10 -> seen",
            ],
            phase_rows,
        )
    )
    print()
    print(
        f"AIR breakdown (medians): submit() returned {fmt(air['submit_returned_s'])} s,"
        f" STARTING seen {fmt(air.get('starting_s'))} s, RUNNING seen {fmt(air.get('running_s'))} s,"
        f" step 10 in worker {fmt(air['worker_step10_s'])} s,"
        f" metrics event {fmt(air['seen_s'])} s, log line {fmt(air['log_step10_s'])} s,"
        f" SUCCEEDED {fmt(air['end_s'])} s; the gateway used {fmt(air['gateway_cpu_s'])} s of CPU"
        " per job"
    )
    ratios = {
        k: summary[k]["seen_s"] / base["seen_s"] for k in ("air-before", "air-cold") if k in summary
    }
    for kind, r in ratios.items():
        other = summary[kind]
        print(
            f"{labels[kind]}: RUNNING seen {fmt(other.get('running_s'))} s,"
            f" step 10 in worker {fmt(other['worker_step10_s'])} s,"
            f" metrics event {fmt(other['seen_s'])} s ({fmt(r, 3)}x c10d)"
        )
    ratio_cold = ratios.get("air-cold", float("nan"))
    verdict = "meets" if ratio <= GOAL_RATIO else "misses"
    print(
        f"AIR / torchrun-c10d: {fmt(ratio, 3)}x to step 10 seen ({verdict} the <= {GOAL_RATIO}x goal);"
        f" {fmt(ratio_worker, 3)}x to step 10 in the worker."
        f" {a.runs} runs, {steps} steps of {step_sleep * 1000:.0f} ms,"
        f" {time.perf_counter() - t_start:.0f} s in all; load average {load_before[0]:.1f} before,"
        f" {os.getloadavg()[0]:.1f} after."
    )
    path = write_result(
        "launch",
        {
            "args": vars(a),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "steps": steps,
            "goal_ratio": GOAL_RATIO,
            "ratio_air_vs_c10d": ratio,
            "ratio_air_vs_c10d_worker_step10": ratio_worker,
            "ratio_air_cold_vs_c10d": ratio_cold,
            "ratio_air_before_vs_c10d": ratios.get("air-before", float("nan")),
            "summary": summary,
            "runs": runs,
        },
    )
    print(f"wrote {path}")
    shutil.rmtree(code_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
