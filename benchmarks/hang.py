"""Hang detection: from SIGSTOP of one rank to the restart, AIR with
`failure={"hang_timeout_s": T}` vs bare `torchrun --max-restarts=1` with the same
SIGSTOP, 2 nodes x 1 rank, gloo on CPU, the same script and resume code as recovery.py.

AIR: SIGSTOP -> RESTARTING state event (detect: T plus the stack dump and teardown;
a stopped rank ignores SIGTERM, so teardown waits for the SIGKILL) and SIGSTOP ->
first step of attempt 2; the failure record of attempt 1 should carry every rank's
stack (py-spy). torchrun: its agents watch processes, not progress, and rank 0 waits
in a gloo allreduce (30 min default timeout), so nothing happens; it is watched for
3*T seconds and then killed.

Usage: .venv/bin/python benchmarks/hang.py --runs 2 --timeout 10
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
    kill_marked,
    markdown_table,
    median,
    write_result,
)
from recovery import SCRIPT, rank_pid  # noqa: E402

STOP_AT_STEP = 20


def _events(job, after: int) -> tuple[list, int]:
    page = job.events(after=after, limit=10_000)
    return page.events, page.last_seq


def run_air(client, src: Path, timeout_s: float) -> dict:
    from air_sdk.schema import JobSpec, Resources

    marker = f"air-{time.time_ns()}"
    job = client.submit(
        JobSpec(
            entrypoint="train.py",
            args=["CKPT"],
            env={"BENCH_MARKER": marker},
            resources=Resources(nodes=2),
            max_restarts=1,
            failure={"hang_timeout_s": timeout_s, "backoff_base_s": 0.0, "backoff_max_s": 0.0},
        ),
        workdir=src,
    )
    deadline = time.time() + 120
    while (job.snapshot().step or 0) < STOP_AT_STEP:
        if time.time() > deadline:
            raise RuntimeError(f"AIR job never reached step {STOP_AT_STEP}: {job.record()}")
        time.sleep(0.1)
    pid = rank_pid(marker, 1)
    assert pid is not None, "rank 1 not found"
    t_stop = time.time()
    os.kill(pid, signal.SIGSTOP)
    restarting = first_step = None
    seq = 0
    deadline = time.time() + timeout_s + 120
    while first_step is None and time.time() < deadline:
        events, seq = _events(job, seq)
        for e in events:
            if (
                restarting is None
                and e.type.value == "state"
                and e.data["state"] == "RESTARTING"
                and e.ts > t_stop
            ):
                restarting = e.ts
            if first_step is None and e.type.value == "metrics" and e.attempt == 2:
                first_step = e.ts
        time.sleep(0.2)
    job.cancel()
    try:
        os.kill(pid, signal.SIGKILL)  # should be gone already (teardown)
    except OSError:
        pass
    job.wait(timeout=60)
    failure = job.attempts()[0].failure
    stacks = failure.stacks if failure else {}
    return {
        "detect_s": (restarting - t_stop) if restarting else float("nan"),
        "first_step_s": (first_step - t_stop) if first_step else float("nan"),
        "kind": failure.kind if failure else None,
        "stalled_ranks": failure.stalled_ranks if failure else [],
        "ranks_with_stack": sum(1 for s in stacks.values() if s.strip()),
        "ranks_with_python_stack": sum(
            1 for s in stacks.values() if s.strip() and not s.startswith("no stack")
        ),
        "stack_sample": next(iter(stacks.values()), "")[:400],
    }


def run_torchrun(src: Path, watch_s: float) -> dict:
    marker = f"torchrun-{time.time_ns()}"
    ckpt = Path(tempfile.mkdtemp(prefix="air-bench-hang-torchrun-"))
    port = free_port()
    env = {**os.environ, **QUIET_ENV, "BENCH_MARKER": marker}
    cmd = c10d_agent_cmd(port, marker, 1, "train.py", str(ckpt))
    procs = [
        subprocess.Popen(
            cmd,
            cwd=src,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
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
    deadline = time.time() + 120
    while not any(line.startswith(f"STEP {STOP_AT_STEP} ") for line in lines):
        if time.time() > deadline:
            raise RuntimeError("torchrun never reached the stop step")
        time.sleep(0.05)
    pid = rank_pid(marker, 1)
    assert pid is not None
    seen = len(lines)
    t_stop = time.time()
    os.kill(pid, signal.SIGSTOP)
    restarted = None
    while time.time() - t_stop < watch_s:
        if any(x.startswith("RESUMED") for x in lines[seen:]):
            restarted = time.time() - t_stop
            break
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    watched = time.time() - t_stop
    steps_after = sum(1 for x in lines[seen:] if x.startswith("STEP"))
    exited = [p.poll() for p in procs]
    kill_marked(marker)  # agents and workers (torchrun may start workers in new sessions)
    for p in procs:
        p.wait(timeout=30)
    return {
        "restart_s": restarted,
        "watched_s": watched,
        "agents_exited": exited,
        "steps_after_stop": steps_after,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=10.0, help="hang_timeout_s (T)")
    ap.add_argument("--watch", type=float, default=None, help="torchrun watch, default 3*T")
    args = ap.parse_args()
    watch = args.watch if args.watch is not None else 3 * args.timeout
    src = Path(tempfile.mkdtemp(prefix="air-bench-hang-"))
    (src / "train.py").write_text(
        SCRIPT.replace(
            "air.checkpoint.configure(sys.argv[1], keep=2)",
            "air.checkpoint.configure(None if sys.argv[1] == 'CKPT' else sys.argv[1], keep=2)",
        ).replace("while step < 400:", "while step < 100000:")
    )
    air_runs, torchrun_runs = [], []
    with air_gateway() as (client, _gw, _home):
        for i in range(args.runs):
            air_runs.append(run_air(client, src, args.timeout))
            if i == 0:  # torchrun never notices: one watch is enough
                torchrun_runs.append(run_torchrun(src, watch))
    t = args.timeout
    det = median([r["detect_s"] for r in air_runs])
    first = median([r["first_step_s"] for r in air_runs])
    print(header(f"Hang: SIGSTOP of one rank to the restart, T = {t:g} s, median of {args.runs}"))
    print()
    rows = [
        [
            f"AIR, hang_timeout_s={t:g}",
            fmt(det),
            fmt(det - t),
            fmt(first),
            ", ".join(f"{fmt(r['detect_s'])}/{fmt(r['first_step_s'])}" for r in air_runs),
            ", ".join(f"{r['ranks_with_python_stack']}/2" for r in air_runs),
        ]
    ]
    for r in torchrun_runs:
        rows.append(
            [
                "torchrun --max-restarts=1",
                fmt(r["restart_s"])
                if r["restart_s"]
                else f"no restart after {r['watched_s']:.0f} s",
                "n/a",
                "n/a",
                f"{r['steps_after_stop']} steps after the stop, agents exited: {r['agents_exited']}",
                "none",
            ]
        )
    print(
        markdown_table(
            [
                "runner",
                "stop -> restart s",
                "minus T",
                "stop -> first step of attempt 2 s",
                "runs (restart/first step)",
                "ranks with a stack",
            ],
            rows,
        )
    )
    print(f"\ngoal: restart within T + 5 s: detect - T = {det - t:.2f} s")
    print(
        f"failure kind: {[r['kind'] for r in air_runs]}, stalled: "
        f"{[r['stalled_ranks'] for r in air_runs]}"
    )
    print(f"stack sample: {air_runs[0]['stack_sample']!r}")
    write_result(
        "hang",
        {"runs": args.runs, "timeout_s": t, "air": air_runs, "torchrun": torchrun_runs},
    )


if __name__ == "__main__":
    main()
