"""Scheduler speed: how long one `decide()` cycle takes at scale.

Two measurements on a simulated 1,000-node cluster (8 GPUs per node, 4 pools of
two accelerator types over two regions), with queued jobs shaped like the Philly
trace (`generate_trace`: 70% 1-GPU jobs, a few 16-64 GPU gangs), 8 tenants with
quotas and weights, three priority classes, a fifth of the jobs routed with
pool "any" and a tenth by accelerator only:

- throughput: 10,000 queued jobs. A burst cycle on an empty cluster, then steady
  cycles where 2% of the running jobs end before each cycle and new arrivals keep
  10,000 queued. Placements per second = jobs placed / time inside decide().
- latency: 1,000 queued jobs on a busy cluster, 1% of running jobs ending before
  each cycle; p50/p99/max cycle time.

Busy runs start from a cluster filled by the FIFO baseline and one untimed cycle
(in which `SchedulerState` builds its book of the running jobs). Preemptions are
carried out as the runner does: a victim is stopping (`terminating`) during the next
cycle and back in the queue after it.

The same cycles through `schedule_fifo` (plain FIFO gang) are timed for reference.
Goals: >= 500 placements/s (Slurm quotes ~500 jobs/s; kube-scheduler 100-300 pods/s)
and p99 < 10 ms with 1,000 queued. Nothing here asserts a timing.

    .venv/bin/python benchmarks/scheduler_speed.py [--nodes 1000] [--queued 10000]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, header, markdown_table, percentile, write_result  # noqa: E402

from air_sdk.scheduler import (  # noqa: E402
    Decision,
    JobRequest,
    NodeSpec,
    RunningJob,
    SchedulerPolicy,
    SchedulerState,
    TenantQuota,
    decide,
    schedule_fifo,
)
from air_sdk.scheduler.sim import generate_trace  # noqa: E402
from air_sdk.schema import Placement  # noqa: E402

GOAL_PLACEMENTS_PER_S = 500.0
GOAL_P99_MS = 10.0
POOLS = (("a100-eu", "a100", "eu"), ("a100-us", "a100", "us"), ("h100-eu", "h100", "eu"),
         ("h100-us", "h100", "us"))  # fmt: skip
TENANTS = [f"team-{k}" for k in range(8)]


def cluster(num_nodes: int) -> list[NodeSpec]:
    nodes = []
    for i in range(num_nodes):
        pool, acc, region = POOLS[i % len(POOLS)]
        nodes.append(
            NodeSpec(
                name=f"node-{i:05d}",
                slots=8,
                gpus=tuple(range(8)),
                pool=pool,
                accelerator=acc,
                labels={"region": region, "rack": f"r{i // 32}"},
            )
        )
    return nodes


def policy(num_gpus: int) -> SchedulerPolicy:
    # each tenant may hold up to half the cluster; weights 1..2
    quota = TenantQuota(gpus=num_gpus // 2)
    return SchedulerPolicy(
        quotas={t: quota for t in TENANTS},
        weights={t: 1.0 + (k % 2) for k, t in enumerate(TENANTS)},
    )


class Workload:
    """Philly-shaped job requests, numbered as they arrive."""

    def __init__(self, seed: int, num_gpus: int) -> None:
        self.rng = random.Random(seed)
        self.shapes = generate_trace(20_000, cluster_gpus=num_gpus, seed=seed, estimates="over")
        self.count = 0
        self.clock = 0.0

    def next(self) -> JobRequest:
        j = self.shapes[self.count % len(self.shapes)]
        self.count += 1
        self.clock += 1.0
        r = self.rng.random()
        if r < 0.2:
            pool, acc = "any", None
        elif r < 0.3:
            pool, acc = "any", self.rng.choice(("a100", "h100"))
        else:
            pool, acc = self.rng.choice(POOLS)[0], None
        return JobRequest(
            job_id=f"j{self.count:07d}",
            nodes=j.nodes,
            slots_per_node=j.slots,
            gpus_per_node=j.gpus_per_node,
            pool=pool,
            accelerator=acc,
            tenant=self.rng.choice(TENANTS),
            priority=j.priority,
            submitted_at=self.clock,
            est_duration_s=j.est_duration,
        )


#: (queue, inventory, running, now, policy) -> (placements, the Decision or None)
Scheduler = Callable[..., tuple[list[Placement], Decision | None]]


def run_air(queue, inventory, running, now, pol=None):  # type: ignore[no-untyped-def]
    d = decide(queue, inventory, list(running.values()), pol, now)
    return d.placements, d


def make_air_state():  # type: ignore[no-untyped-def]
    state = SchedulerState()

    def run(queue, inventory, running, now, pol=None):  # type: ignore[no-untyped-def]
        d = state.decide(queue, inventory, list(running.values()), pol, now)
        return d.placements, d

    return run


def run_fifo(queue, inventory, running, now, pol=None):  # type: ignore[no-untyped-def]
    return schedule_fifo(queue, inventory, [r.placement for r in running.values()]), None


def cycles(
    name: str,
    schedule: Any,
    inventory: list[NodeSpec],
    pol: SchedulerPolicy,
    *,
    queued: int,
    num_cycles: int,
    end_fraction: float,
    prefill: bool,
    seed: int,
) -> dict[str, Any]:
    """Run `num_cycles` cycles keeping `queued` jobs queued; time the scheduler only."""
    rng = random.Random(seed)
    work = Workload(seed, sum(n.num_gpus for n in inventory))
    by_id: dict[str, JobRequest] = {}
    queue: dict[str, JobRequest] = {}
    running: dict[str, RunningJob] = {}
    now = 0.0

    def refill() -> None:
        while len(queue) < queued:
            r = work.next()
            queue[r.job_id] = r
            by_id[r.job_id] = r

    def start(placements: list[Placement]) -> None:
        for p in placements:
            r = queue.pop(p.job_id)
            running[p.job_id] = RunningJob(
                placement=p,
                tenant=r.tenant,
                priority=r.priority,
                started_at=now,
                est_end=None if r.est_duration_s is None else now + r.est_duration_s,
            )

    #: victims of the last cycle's preemptions: stopping (terminating) during this one
    stopping: list[str] = []

    def preempt(decision: Decision | None) -> None:
        """As the runner does: a victim is marked terminating for the next cycle (SIGTERM,
        a grace period to checkpoint) and is back in the queue, exited, the cycle after."""
        for job_id in stopping:
            if job_id in running:
                del running[job_id]
                queue[job_id] = by_id[job_id]
        stopping.clear()
        for pre in decision.preemptions if decision is not None else ():
            r = running.get(pre.victim_job_id)
            if r is not None and not r.terminating:
                running[pre.victim_job_id] = dataclasses.replace(r, terminating=True)
                stopping.append(pre.victim_job_id)

    refill()
    if prefill:  # a busy cluster: fill it with the FIFO baseline, untimed
        while True:
            placements = schedule_fifo(
                list(queue.values()), inventory, [r.placement for r in running.values()]
            )
            if not placements:
                break
            start(placements)
            refill()
    times: list[float] = []
    cpu_times: list[float] = []
    worded: list[float] = []
    placed: list[int] = []
    if prefill:  # one untimed cycle: SchedulerState builds its book of the running jobs
        now += 60.0
        placements, decision = schedule(list(queue.values()), inventory, running, now, pol)
        start(placements)
        preempt(decision)
        refill()
    gc.collect()
    for _ in range(num_cycles):
        now += 60.0
        if running and end_fraction > 0:
            ending = rng.sample(sorted(running), max(1, int(len(running) * end_fraction)))
            for job_id in ending:
                del running[job_id]
        q = list(queue.values())
        cpu = time.thread_time()
        tic = time.perf_counter()
        placements, decision = schedule(q, inventory, running, now, pol)
        times.append(time.perf_counter() - tic)
        cpu_times.append(time.thread_time() - cpu)
        if decision is not None:  # what wording every explanation would add
            tic = time.perf_counter()
            dict(decision.explanations)
            worded.append(times[-1] + time.perf_counter() - tic)
        placed.append(len(placements))
        start(placements)
        preempt(decision)
        refill()
    total_t = sum(times)
    used = sum(r.num_gpus for r in running.values())
    return {
        "scheduler": name,
        "queued": queued,
        "cycles": num_cycles,
        "placements": sum(placed),
        "placements_per_s": sum(placed) / total_t if total_t else 0.0,
        "first_cycle_ms": times[0] * 1e3,
        "first_cycle_placements": placed[0],
        "p50_ms": percentile(times, 50) * 1e3,
        "p99_ms": percentile(times, 99) * 1e3,
        "max_ms": max(times) * 1e3,
        "cpu_p50_ms": percentile(cpu_times, 50) * 1e3,
        "cpu_p99_ms": percentile(cpu_times, 99) * 1e3,
        "worded_p50_ms": percentile(worded, 50) * 1e3 if worded else None,
        "worded_p99_ms": percentile(worded, 99) * 1e3 if worded else None,
        "mean_placements_per_cycle": sum(placed) / len(placed),
        "running_at_end": len(running),
        "gpu_use_at_end": used / sum(n.num_gpus for n in inventory),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--latency-queued", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--latency-cycles", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs of each measurement; the table shows the best"
    )
    args = ap.parse_args()
    load_before = os.getloadavg()
    inventory = cluster(args.nodes)
    pol = policy(sum(n.num_gpus for n in inventory))
    rows = []
    results: dict[str, Any] = {}
    schedulers = (
        ("air SchedulerState.decide", make_air_state),
        ("air decide (stateless)", lambda: run_air),
        ("fifo", lambda: run_fifo),
    )
    for name, make in schedulers:
        runs: dict[str, list[dict[str, Any]]] = {"burst": [], "steady": [], "latency": []}
        for _ in range(args.repeat):
            runs["burst"].append(cycles(name, make(), inventory, pol, queued=args.queued,
                num_cycles=1, end_fraction=0.0, prefill=False, seed=args.seed))  # fmt: skip
            runs["steady"].append(cycles(name, make(), inventory, pol, queued=args.queued,
                num_cycles=args.cycles, end_fraction=0.02, prefill=True, seed=args.seed))  # fmt: skip
            runs["latency"].append(cycles(name, make(), inventory, pol,
                queued=args.latency_queued, num_cycles=args.latency_cycles, end_fraction=0.01,
                prefill=True, seed=args.seed))  # fmt: skip
        # the best of the repeats: other processes on a shared machine only ever slow a run
        burst = max(runs["burst"], key=lambda r: r["placements_per_s"])
        steady = max(runs["steady"], key=lambda r: r["placements_per_s"])
        latency = min(runs["latency"], key=lambda r: r["p99_ms"])
        results[name] = {"burst": burst, "steady": steady, "latency": latency, "all_runs": runs}
        rows.append(
            [
                name,
                f"{burst['first_cycle_placements']} in {fmt(burst['first_cycle_ms'], 1)} ms"
                f" ({burst['placements_per_s']:,.0f}/s)",
                f"{steady['placements_per_s']:,.0f}/s (p50 {fmt(steady['p50_ms'], 1)} ms,"
                f" {steady['mean_placements_per_cycle']:.0f}/cycle)",
                f"{fmt(latency['p50_ms'], 2)} / {fmt(latency['p99_ms'], 2)} /"
                f" {fmt(latency['max_ms'], 2)} ms",
                f"{fmt(latency['cpu_p50_ms'], 2)} / {fmt(latency['cpu_p99_ms'], 2)} ms",
                f"{fmt(latency['worded_p99_ms'], 2)} ms",
            ]
        )
    load_after = os.getloadavg()
    print(header(f"Scheduler speed: {args.nodes} nodes, {args.queued} queued"))
    print(
        f"\nload average before/after: {load_before[0]:.2f} / {load_after[0]:.2f};"
        f" best of {args.repeat} runs each"
    )
    print()
    print(
        markdown_table(
            [
                "scheduler",
                f"burst: {args.queued:,} queued, empty cluster",
                f"steady: {args.queued:,} queued, 2% end per cycle",
                f"{args.latency_queued:,} queued, busy: p50 / p99 / max cycle",
                "same, CPU time: p50 / p99",
                "same, p99 with every explanation worded",
            ],
            rows,
        )
    )
    air = results["air SchedulerState.decide"]
    print()
    print(
        f"goal >= {GOAL_PLACEMENTS_PER_S:.0f} placements/s: steady"
        f" {air['steady']['placements_per_s']:,.0f}/s ->"
        f" {'met' if air['steady']['placements_per_s'] >= GOAL_PLACEMENTS_PER_S else 'NOT met'};"
        f" goal p99 < {GOAL_P99_MS:.0f} ms with {args.latency_queued:,} queued:"
        f" {fmt(air['latency']['p99_ms'], 2)} ms ->"
        f" {'met' if air['latency']['p99_ms'] < GOAL_P99_MS else 'NOT met'}"
    )
    path = write_result(
        "scheduler_speed",
        {"args": vars(args), "load_average": [load_before, load_after], "results": results},
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
