"""SchedulerState.decide (incremental) decides exactly what decide (from scratch) does."""

from __future__ import annotations

import dataclasses
import random

from air_sdk.scheduler import (
    JobRequest,
    NodeSpec,
    RunningJob,
    SchedulerPolicy,
    SchedulerState,
    TenantQuota,
    decide,
)

POLICY = SchedulerPolicy(quotas={"t0": TenantQuota(gpus=24)}, weights={"t1": 2.0})


def _inventory() -> list[NodeSpec]:
    return [
        NodeSpec(
            f"{pool}-{i}",
            8,
            tuple(range(8)),
            pool=pool,
            accelerator="a100" if pool != "h" else "h100",
            labels={"region": "ab"[i % 2]},
        )
        for pool in ("a", "b", "h")
        for i in range(4)
    ]


def _request(rng: random.Random, k: int, now: float) -> JobRequest:
    gpus = rng.choice([1, 1, 1, 2, 4, 8])
    return JobRequest(
        f"j{k}",
        nodes=rng.choice([1, 1, 1, 2]),
        slots_per_node=gpus,
        gpus_per_node=gpus,
        pool=rng.choice(["a", "b", "h", "any"]),
        tenant=rng.choice(["t0", "t1", "t2"]),
        priority=rng.choice(["low", "normal", "normal", "high"]),
        submitted_at=now,
        est_duration_s=rng.choice([None, rng.uniform(10, 300)]),
    )


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert [p.model_dump() for p in a.placements] == [p.model_dump() for p in b.placements]
    assert a.preemptions == b.preemptions
    assert a.explanations == b.explanations
    assert a.positions == b.positions
    assert a.routes == b.routes
    assert a.reservations == b.reservations


def test_incremental_state_matches_stateless_decide_over_many_cycles():
    for seed in range(6):
        rng = random.Random(seed)
        inv = _inventory()
        state = SchedulerState()
        queue: list[JobRequest] = []
        running: dict[str, RunningJob] = {}
        k = 0
        for cycle in range(40):
            now = cycle * 10.0
            for _ in range(rng.randint(0, 6)):
                queue.append(_request(rng, k, now))
                k += 1
            # some jobs end; some get a new (equal or changed) RunningJob object
            for job_id in list(running):
                r = rng.random()
                if r < 0.15:
                    del running[job_id]
                elif r < 0.25:
                    running[job_id] = dataclasses.replace(running[job_id])
                elif r < 0.28:
                    running[job_id] = dataclasses.replace(running[job_id], terminating=True)
            if rng.random() < 0.1:  # a node's health flips
                i = rng.randrange(len(inv))
                inv[i] = dataclasses.replace(inv[i], healthy=not inv[i].healthy)
            rl = list(running.values())
            expected = decide(queue, inv, rl, POLICY, now)
            got = state.decide(queue, inv, rl, POLICY, now)
            _same(expected, got)
            by_id = {q.job_id: q for q in queue}
            for p in got.placements:
                q = by_id[p.job_id]
                queue.remove(q)
                end = None if q.est_duration_s is None else now + q.est_duration_s
                running[p.job_id] = RunningJob(p, q.tenant, q.priority, now, end)
            for pre in got.preemptions:
                running[pre.victim_job_id] = dataclasses.replace(
                    running[pre.victim_job_id], terminating=True
                )
