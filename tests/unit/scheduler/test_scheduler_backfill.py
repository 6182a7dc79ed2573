"""EASY backfill: small jobs may pass a blocked large one only if they do not delay it."""

from __future__ import annotations

import random

from sched_helpers import gpu_nodes, job, running, started

from air_sdk.scheduler import NodeSpec, RunningJob, SchedulerPolicy, decide
from air_sdk.schema import Placement

POLICY = SchedulerPolicy()


def _busy() -> list[RunningJob]:
    # n0+n1 free at t=100, n2 at t=50; n3 is free now
    return [running("r1", ["n0", "n1"], end=100.0), running("r2", ["n2"], end=50.0)]


def test_head_gets_a_reservation_when_running_jobs_end():
    d = decide([job("big", nodes=4, at=1, est=500)], gpu_nodes(4), _busy(), POLICY, now=0)
    res = d.reservations["default"]
    assert (res.job_id, res.start_at) == ("big", 100.0)
    assert d.explanations["big"].endswith("expected to start in 2 min")


def test_short_job_backfills_when_it_ends_before_the_reservation():
    q = [job("big", nodes=4, at=1, est=500), job("short", at=2, est=60)]
    d = decide(q, gpu_nodes(4), _busy(), POLICY, now=0)
    assert started(d) == ["short"]
    assert d.positions == {"big": 1}


def test_long_job_is_refused_when_it_would_delay_the_head():
    q = [job("big", nodes=4, at=1, est=500), job("long", at=2, est=300)]
    d = decide(q, gpu_nodes(4), _busy(), POLICY, now=0)
    assert started(d) == []
    assert d.explanations["long"].startswith(
        "reserved for job big (backfill): the free capacity in pool 'default' is held for it"
    )
    assert "would still run when big is to start (in 2 min)" in d.explanations["long"]


def test_job_without_estimate_backfills_only_into_capacity_the_head_does_not_need():
    inv = gpu_nodes(5)  # the head needs 4 of the 5 nodes
    q = [job("big", nodes=4, at=1, est=500), job("unknown", at=2)]
    d = decide(q, inv, _busy(), POLICY, now=0)
    assert started(d) == ["unknown"]
    assert d.placements[0].nodes[0].node not in d.reservations["default"].nodes
    # with only 4 nodes, every free GPU is needed by the head: refused
    d = decide(q, gpu_nodes(4), _busy(), POLICY, now=0)
    assert started(d) == []
    assert "this job has no duration estimate" in d.explanations["unknown"]


def test_spare_gpus_on_reserved_nodes_can_be_backfilled():
    inv = gpu_nodes(2)
    busy = [running("r", ["n0", "n1"], gpus=6, end=100.0)]
    # the head needs 2 nodes x 4 GPUs at t=100: each reserved node then spares 4 of 8;
    # 2 are free now, and a no-estimate 2-GPU job can take them without harm
    q = [job("head", nodes=2, gpus=4, at=1), job("tiny", gpus=2, at=2)]
    d = decide(q, inv, busy, POLICY, now=0)
    assert started(d) == ["tiny"]


def test_no_backfill_when_it_is_off():
    pol = SchedulerPolicy(backfill=False)
    q = [job("big", nodes=4, at=1, est=500), job("short", at=2, est=60)]
    d = decide(q, gpu_nodes(4), _busy(), pol, now=0)
    assert started(d) == []
    assert d.explanations["short"] == "behind 1 job in pool 'default' (first: big); backfill is off"


def test_unknown_end_of_running_jobs_makes_the_start_time_unknown():
    busy = [running("r1", ["n0", "n1"]), running("r2", ["n2"])]  # no est_end
    q = [job("big", nodes=4, at=1, est=500), job("short", at=2, est=60)]
    d = decide(q, gpu_nodes(4), busy, POLICY, now=0)
    assert d.reservations["default"].start_at is None
    assert "start time unknown" in d.explanations["big"]
    # nothing can be shown to end before an unknown time: only spare capacity is used
    assert started(d) == []


def _replay(seed: int) -> tuple[float, float]:
    """Step a small cluster through time with exact estimates; returns (the head's
    first promised start, its actual start)."""
    rng = random.Random(seed)
    inv = [NodeSpec(f"n{i}", 4, tuple(range(4))) for i in range(4)]
    pol = SchedulerPolicy(fair_share="fifo", preemption=False)
    runs: dict[str, tuple[Placement, float]] = {}
    now = 0.0
    # initial load: random 1-4 GPU jobs on the nodes, ending at random times
    warm = [job(f"w{k}", gpus=rng.randint(1, 4), at=-1, est=rng.uniform(10, 200)) for k in range(8)]
    for p in decide(warm, inv, [], pol, now).placements:
        est = next(w.est_duration_s for w in warm if w.job_id == p.job_id)
        assert est is not None
        runs[p.job_id] = (p, est)
    queue = [job("head", nodes=4, gpus=4, at=0, est=100)]
    queue += [
        job(f"s{k}", gpus=rng.randint(1, 3), at=1 + k, est=rng.uniform(5, 150)) for k in range(30)
    ]
    promised = None
    while True:
        rj = [RunningJob(p, started_at=0, est_end=end) for p, end in runs.values()]
        d = decide(queue, inv, rj, pol, now)
        if promised is None and "default" in d.reservations:
            promised = d.reservations["default"].start_at
        for p in d.placements:
            q = next(j for j in queue if j.job_id == p.job_id)
            if q.job_id == "head":
                assert promised is not None
                return promised, now
            queue.remove(q)
            assert q.est_duration_s is not None
            runs[p.job_id] = (p, now + q.est_duration_s)
        now = min(end for _, end in runs.values())
        runs = {k: v for k, v in runs.items() if v[1] > now}


def test_backfill_never_delays_the_head_with_exact_estimates():
    for seed in range(25):
        promised, actual = _replay(seed)
        assert actual <= promised + 1e-9, seed
