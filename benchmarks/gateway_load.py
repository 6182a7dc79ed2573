"""Gateway under load: 100 concurrent submissions, and list/status latency with 10,000
jobs in history vs an empty database.

How: a real detached gateway (subprocess, temporary home) whose cluster file gives
every tenant a quota of 0 rank slots, so submitted jobs stay QUEUED (the runner
still runs a scheduling cycle every 100 ms and after every submit, over all of
them) and no training competes for the 2 cores. Per-token rate limits are off:
this measures the gateway, not the limiter. For each database:

1. "history": before the gateway starts, 10,000 jobs are written through the
   store and ended (CANCELLED or FAILED), as a gateway's history would be;
   "empty" has none.
2. 100 threads, each with its own client, wait on a barrier and submit one
   inline-code job each (one POST /v1/jobs with an Idempotency-Key); the time
   of each submit call is its accept latency.
3. One client then times `GET /v1/jobs?limit=100` (list) and `GET /v1/jobs/{id}`
   (status of a queued job) `--reads` times each, interleaved.

Rounds alternate empty / history; medians over rounds are quoted.

    .venv/bin/python benchmarks/gateway_load.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    fmt,
    free_port,
    header,
    markdown_table,
    median,
    percentile,
    write_result,
)

GOAL_ACCEPT_P99_S = 1.0
GOAL_READ_RATIO = 2.0
QUOTA_ZERO = '[tenants."*"]\nslots = 0\ngpus = 0\n'


def fill_history(home: Path, n: int) -> float:
    """Write `n` ended jobs through the store; returns the seconds it took."""
    from air_sdk.schema import FailureInfo, JobSpec, JobState, Resources
    from air_sdk.store import SqliteStore

    t0 = time.perf_counter()
    store = SqliteStore(home / "air.db")
    for i in range(n):
        spec = JobSpec(name=f"old-{i}", code="pass", resources=Resources(nodes=1 + i % 2))
        job, _ = store.create_job(spec, tenant="default")
        if i % 5 == 0:
            reason = "rank 0 exit code 1"
            store.transition(
                job.id, JobState.FAILED, reason, failure=FailureInfo(attempt=0, reason=reason)
            )
        else:
            store.transition(job.id, JobState.CANCELLED, "cancelled by user")
    store.close()
    return time.perf_counter() - t0


def one_round(label: str, history: int, submits: int, reads: int) -> dict[str, Any]:
    from air_sdk.client import Client
    from air_sdk.gateway.options import RequestLimits
    from air_sdk.gateway.server import GatewayOptions, start_detached, stop_detached
    from air_sdk.schema import JobSpec, JobState

    home = Path(tempfile.mkdtemp(prefix="air-load-"))
    fill_s = fill_history(home, history) if history else 0.0
    cluster = home / "cluster.toml"
    cluster.write_text(QUOTA_ZERO)
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        cluster_file=cluster,
        limits=RequestLimits(user_rate=None, anonymous_rate=None),
    )
    gw = start_detached(opts)
    try:
        clients = [Client(gw.url, gw.token) for _ in range(submits)]
        barrier = threading.Barrier(submits)
        spec = JobSpec(name="load", code="print('hi')")

        def submit(c: Client) -> tuple[float, str]:
            barrier.wait()
            t = time.perf_counter()
            job = c.submit(spec)
            return time.perf_counter() - t, job.id

        with ThreadPoolExecutor(submits) as pool:
            results = list(pool.map(submit, clients))
        accept = [r[0] for r in results]
        ids = [r[1] for r in results]
        for c in clients:
            c.close()
        reader = Client(gw.url, gw.token)
        assert all(j.state is JobState.QUEUED for j in reader.jobs(limit=submits))
        list_s, status_s = [], []
        for i in range(reads):
            t = time.perf_counter()
            reader.jobs(limit=100)
            list_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            reader.job(ids[i % len(ids)]).record()
            status_s.append(time.perf_counter() - t)
        reader.close()
    finally:
        stop_detached(home)
        shutil.rmtree(home, ignore_errors=True)
    return {
        "db": label,
        "history": history,
        "fill_s": fill_s,
        "accept_s": accept,
        "list_s": list_s,
        "status_s": status_s,
        "load": os.getloadavg(),
    }


def summarize(rounds: list[dict[str, Any]], db: str) -> dict[str, float]:
    mine = [r for r in rounds if r["db"] == db]

    def med(key: str, q: float) -> float:
        return median([percentile(r[key], q) for r in mine])

    return {
        "accept_p50_s": med("accept_s", 50),
        "accept_p99_s": med("accept_s", 99),
        "accept_max_s": median([max(r["accept_s"]) for r in mine]),
        "list_p50_ms": med("list_s", 50) * 1e3,
        "list_p99_ms": med("list_s", 99) * 1e3,
        "status_p50_ms": med("status_s", 50) * 1e3,
        "status_p99_ms": med("status_s", 99) * 1e3,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="rounds per database")
    p.add_argument("--history", type=int, default=10_000, help="ended jobs in the full database")
    p.add_argument("--submits", type=int, default=100, help="concurrent submissions")
    p.add_argument("--reads", type=int, default=300, help="list and status calls per round")
    a = p.parse_args()
    rounds = []
    for i in range(a.runs):
        for db, n in (("empty", 0), ("history", a.history)):
            r = one_round(db, n, a.submits, a.reads)
            rounds.append(r)
            print(
                f"round {i + 1} {db}: accept p99 {percentile(r['accept_s'], 99):.3f} s,"
                f" list p99 {percentile(r['list_s'], 99) * 1e3:.1f} ms,"
                f" status p99 {percentile(r['status_s'], 99) * 1e3:.1f} ms"
                f" (load {r['load'][0]:.1f})",
                flush=True,
            )
    empty, full = summarize(rounds, "empty"), summarize(rounds, "history")
    print()
    print(header("Gateway under load"))
    print()
    rows = [
        [
            name,
            fmt(s["accept_p50_s"], 3),
            fmt(s["accept_p99_s"], 3),
            fmt(s["accept_max_s"], 3),
            fmt(s["list_p50_ms"], 1),
            fmt(s["list_p99_ms"], 1),
            fmt(s["status_p50_ms"], 1),
            fmt(s["status_p99_ms"], 1),
        ]
        for name, s in (("empty", empty), (f"{a.history:,} jobs in history", full))
    ]
    print(
        markdown_table(
            [
                "database",
                "accept p50 s",
                "accept p99 s",
                "accept max s",
                "list p50 ms",
                "list p99 ms",
                "status p50 ms",
                "status p99 ms",
            ],
            rows,
        )
    )
    ratios = {
        "list_p99": full["list_p99_ms"] / empty["list_p99_ms"],
        "status_p99": full["status_p99_ms"] / empty["status_p99_ms"],
    }
    print()
    print(
        f"{a.submits} concurrent submits: p99 accept {fmt(full['accept_p99_s'], 3)} s with history,"
        f" {fmt(empty['accept_p99_s'], 3)} s empty (goal < {GOAL_ACCEPT_P99_S:g} s)."
        f" History/empty p99: list {ratios['list_p99']:.2f}x, status {ratios['status_p99']:.2f}x"
        f" (goal <= {GOAL_READ_RATIO:g}x)."
    )
    path = write_result(
        "gateway_load",
        {"args": vars(a), "empty": empty, "history": full, "ratios": ratios, "rounds": rounds},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
