"""The trace generator reproduces the statistics it is calibrated to."""

from __future__ import annotations

import math

import pytest

from air_sdk.scheduler.sim import PHILLY, TraceProfile, gang_shape, generate_trace, trace_stats
from air_sdk.scheduler.sim.trace import PAI_ACCELERATORS


@pytest.fixture(scope="module")
def jobs():
    return generate_trace(20_000, cluster_gpus=512, load=0.8, seed=7)


def test_job_sizes_follow_philly(jobs):
    stats = trace_stats(jobs)
    for gpus, p in PHILLY.gpu_demand:
        assert stats.share_by_gpus.get(gpus, 0.0) == pytest.approx(p, abs=0.012), gpus
    assert stats.share_by_gpus[1] > 0.65  # most jobs use one GPU
    assert max(stats.share_by_gpus) >= 32  # and a few are very large


def test_durations_are_heavy_tailed_lognormal(jobs):
    stats = trace_stats(jobs)
    assert stats.duration_p50_s == pytest.approx(274 * 60, rel=0.06)
    assert stats.duration_p80_s == pytest.approx(1000 * 60, rel=0.10)
    assert stats.duration_p99_s > 20 * stats.duration_p50_s  # heavy tail
    assert max(j.duration for j in jobs) <= PHILLY.duration_max_s


def test_offered_load_and_poisson_arrivals(jobs):
    work = sum(j.num_gpus * j.duration for j in jobs)
    span = jobs[-1].arrival - jobs[0].arrival
    assert work / (512 * span) == pytest.approx(0.8, rel=0.05)
    gaps = [b.arrival - a.arrival for a, b in zip(jobs, jobs[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert 0.95 < cv < 1.4  # exponential gaps (cv 1), a little more from the diurnal swing


def test_diurnal_swing(jobs):
    stats = trace_stats(jobs)
    # rate 1 + 0.5 cos: the 6 busiest hours against the 6 quietest, about 2.6 : 1
    assert 2.0 < stats.diurnal_peak_to_trough < 3.3
    flat = generate_trace(
        20_000, cluster_gpus=512, seed=7, profile=TraceProfile(diurnal_amplitude=0.0)
    )
    assert trace_stats(flat).diurnal_peak_to_trough < 1.25


def test_priorities_and_tenants(jobs):
    stats = trace_stats(jobs)
    for prio, p in PHILLY.priority_mix:
        assert stats.share_by_priority[prio] == pytest.approx(p, abs=0.015)
    shares = [stats.share_by_tenant[f"t{k}"] for k in range(PHILLY.num_tenants)]
    assert shares == sorted(shares, reverse=True)  # Zipf: t0 submits the most


def test_estimates_modes():
    exact = generate_trace(300, cluster_gpus=64, seed=1)
    assert all(j.est_duration == j.duration for j in exact)
    over = generate_trace(300, cluster_gpus=64, seed=1, estimates="over")
    assert all(j.duration <= (j.est_duration or 0) <= 3 * j.duration for j in over)
    none = generate_trace(300, cluster_gpus=64, seed=1, estimates="none")
    assert all(j.est_duration is None for j in none)


def test_same_seed_same_trace_and_pai_accelerator_mix():
    assert generate_trace(50, cluster_gpus=64, seed=3) == generate_trace(
        50, cluster_gpus=64, seed=3
    )
    assert sum(p for _, p in PAI_ACCELERATORS) == pytest.approx(1.0)
    mixed = generate_trace(
        4000, cluster_gpus=256, seed=2, profile=TraceProfile(accelerator_mix=PAI_ACCELERATORS)
    )
    misc = sum(1 for j in mixed if j.accelerator == "misc") / len(mixed)
    assert misc == pytest.approx(2240 / 6742, abs=0.03)


def test_gang_shapes_are_whole_nodes_above_one_node():
    assert gang_shape(1, 8) == (1, 1)
    assert gang_shape(8, 8) == (1, 8)
    assert gang_shape(64, 8) == (8, 8)
    assert gang_shape(10, 8) == (2, 5)


def test_bad_profiles_are_rejected():
    with pytest.raises(ValueError, match="sum to"):
        TraceProfile(gpu_demand=((1, 0.5),))
    with pytest.raises(ValueError, match="num_jobs"):
        generate_trace(0, cluster_gpus=8)
