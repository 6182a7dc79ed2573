"""Scheduler quality: average JCT and utilization of `decide()` against plain FIFO
gang scheduling (`schedule_fifo`), on traces calibrated to the Philly trace.

The simulator (`air_sdk.scheduler.sim`) replays each trace twice on the same
simulated cluster (default 32 nodes x 8 GPUs), once through the real `decide()`
(DRF fair share over 4 tenants, 3 priority classes, EASY backfill, preemption with
a 30 s checkpoint grace) and once through `schedule_fifo`. Traces: Philly job
sizes and run times, Poisson arrivals with a 3:1 day/night swing, offered load
0.7 / 0.8 / 0.9 of the cluster, several seeds; estimates are time limits 1-3x
the true run time ("over"), with exact and missing estimates as variants.

Goal: average JCT at most 0.5x FIFO's at equal or better utilization (Tiresias
reports up to 5.5x lower average JCT than a YARN-like FIFO; Pollux 37-50% lower).
Nothing asserts; the script says whether the goal is met.

    .venv/bin/python benchmarks/scheduler_quality.py [--jobs 4000] [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, header, markdown_table, write_result  # noqa: E402

from air_sdk.scheduler import NodeSpec, SchedulerPolicy  # noqa: E402
from air_sdk.scheduler.sim import SimResult, generate_trace, simulate  # noqa: E402

GOAL_JCT_RATIO = 0.5


def cluster(nodes: int, gpus: int) -> list[NodeSpec]:
    return [NodeSpec(f"node-{i:03d}", gpus, tuple(range(gpus))) for i in range(nodes)]


def size_class(gpus: int) -> str:
    return "1 GPU" if gpus == 1 else "2-8 GPUs" if gpus <= 8 else ">8 GPUs"


def by_class(r: SimResult) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for o in r.outcomes:
        groups.setdefault(size_class(o.gpus), []).append(o.jct)
    return {k: statistics.fmean(v) for k, v in groups.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    inv = cluster(args.nodes, args.gpus_per_node)
    total = args.nodes * args.gpus_per_node
    policy = SchedulerPolicy()
    cases = [(load, "over") for load in args.loads] + [
        (args.loads[-1], est) for est in ("exact", "none")
    ]
    runs = []
    for load, est in cases:
        for seed in range(args.seeds):
            trace = generate_trace(
                args.jobs, cluster_gpus=total, load=load, seed=seed, estimates=est
            )
            row: dict[str, Any] = {"load": load, "estimates": est, "seed": seed}
            for name in ("air", "fifo"):
                tic = time.perf_counter()
                r = simulate(trace, inv, scheduler=name, policy=policy)  # type: ignore[arg-type]
                row[name] = {**r.summary(), "by_class_avg_jct_s": by_class(r)}
                row[name]["sim_wall_s"] = time.perf_counter() - tic
            runs.append(row)
            a, f = row["air"], row["fifo"]
            print(
                f"load {load} est {est} seed {seed}: avg JCT air {a['avg_jct_s'] / 3600:.1f} h"
                f" fifo {f['avg_jct_s'] / 3600:.1f} h (x{a['avg_jct_s'] / f['avg_jct_s']:.2f});"
                f" util {a['utilization']:.3f} vs {f['utilization']:.3f}",
                file=sys.stderr,
            )
    return {"runs": runs}


def table(runs: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["load"], r["estimates"]), []).append(r)
    rows, summary = [], []
    for (load, est), rs in groups.items():

        def med(sched: str, key: str, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.median(r[sched][key] for r in rs)

        ratio = statistics.median(r["air"]["avg_jct_s"] / r["fifo"]["avg_jct_s"] for r in rs)
        util_ok = all(r["air"]["utilization"] >= r["fifo"]["utilization"] - 1e-9 for r in rs)
        met = ratio <= GOAL_JCT_RATIO and util_ok
        summary.append({"load": load, "estimates": est, "jct_ratio": ratio, "met": met})
        cls = {
            c: statistics.median(
                r["air"]["by_class_avg_jct_s"].get(c, 0.0)
                / max(r["fifo"]["by_class_avg_jct_s"].get(c, 1.0), 1e-9)
                for r in rs
            )
            for c in ("1 GPU", "2-8 GPUs", ">8 GPUs")
        }
        rows.append(
            [
                f"{load:.1f}",
                est,
                f"{med('air', 'avg_jct_s') / 3600:.1f} / {med('fifo', 'avg_jct_s') / 3600:.1f}",
                f"**{ratio:.2f}**",
                f"{med('air', 'p95_jct_s') / 3600:.0f} / {med('fifo', 'p95_jct_s') / 3600:.0f}",
                f"{med('air', 'avg_queueing_delay_s') / 3600:.2f} /"
                f" {med('fifo', 'avg_queueing_delay_s') / 3600:.2f}",
                f"{med('air', 'utilization'):.3f} / {med('fifo', 'utilization'):.3f}",
                f"{med('air', 'utilization_while_arriving'):.3f} /"
                f" {med('fifo', 'utilization_while_arriving'):.3f}",
                f"{med('air', 'fairness_jain'):.3f} / {med('fifo', 'fairness_jain'):.3f}",
                " / ".join(fmt(cls[c]) for c in ("1 GPU", "2-8 GPUs", ">8 GPUs")),
                f"{med('air', 'preemptions'):.0f}",
                "met" if met else "not met",
            ]
        )
    headers = [
        "load",
        "estimates",
        "avg JCT h (air / fifo)",
        "ratio",
        "p95 JCT h",
        "avg queueing h",
        "utilization",
        "util. while arriving",
        "fairness (Jain)",
        "JCT ratio 1 / 2-8 / >8 GPUs",
        "preemptions",
        "goal",
    ]
    return markdown_table(headers, rows), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--loads", type=float, nargs="+", default=[0.7, 0.8, 0.9])
    args = ap.parse_args()
    tic = time.perf_counter()
    result = run(args)
    text, summary = table(result["runs"])
    print(
        header(
            f"Scheduler quality: {args.jobs} Philly-like jobs on {args.nodes} x"
            f" {args.gpus_per_node} GPUs, median of {args.seeds} seeds"
        )
    )
    print()
    print(text)
    print()
    met = [s for s in summary if s["met"]]
    where = ", ".join(f"load {s['load']} {s['estimates']}" for s in met) or "none"
    print(
        f"goal: average JCT <= {GOAL_JCT_RATIO}x FIFO at equal or better utilization -> met in"
        f" {len(met)} of {len(summary)} settings"
        f" ({where});"
        f" {time.perf_counter() - tic:.0f} s"
    )
    path = write_result("scheduler_quality", {"args": vars(args), "summary": summary, **result})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
