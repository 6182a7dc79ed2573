"""The simulator: conservation, preemption with requeue, and the FIFO baseline."""

from __future__ import annotations

import pytest
from sched_helpers import gpu_nodes

from air_sdk.scheduler import NodeSpec, SchedulerPolicy
from air_sdk.scheduler.sim import (
    SimulationError,
    TraceJob,
    compare,
    fair_shares,
    generate_trace,
    jain_index,
    simulate,
)


@pytest.fixture(scope="module")
def results():
    inv = gpu_nodes(8)
    trace = generate_trace(300, cluster_gpus=64, load=0.9, seed=11)
    return trace, compare(trace, inv)


def test_every_job_completes_exactly_once_and_no_faster_than_it_runs(results):
    trace, by_name = results
    for r in by_name.values():
        assert sorted(o.job_id for o in r.outcomes) == sorted(j.job_id for j in trace)
        for o in r.outcomes:
            assert o.first_start >= o.arrival
            assert o.finish >= o.first_start + o.duration - 1e-6 or o.preemptions
            assert o.jct >= o.duration - 1e-6


def test_utilization_is_at_most_one_and_work_is_conserved(results):
    trace, by_name = results
    work = sum(j.num_gpus * j.duration for j in trace)
    for r in by_name.values():
        assert 0 < r.utilization <= 1
        assert r.utilization <= r.allocated_utilization + 1e-9 <= 1 + 1e-9
        assert 0 < r.utilization_while_arriving <= 1
        assert r.utilization * 64 * r.makespan == pytest.approx(work)
        assert 0 < r.fairness <= 1


def test_fifo_never_preempts_and_air_waits_less(results):
    _, by_name = results
    assert by_name["fifo"].num_preemptions == 0
    assert by_name["air"].avg_queueing_delay < by_name["fifo"].avg_queueing_delay


def test_preempted_job_requeues_with_its_remaining_work():
    inv = gpu_nodes(1)
    trace = [
        TraceJob("low", 0.0, 1, 8, 1000.0, priority="low", est_duration=1000.0),
        TraceJob("high", 100.0, 1, 8, 50.0, priority="high", est_duration=50.0),
    ]
    r = simulate(trace, inv, grace_s=30.0)
    by_id = {o.job_id: o for o in r.outcomes}
    assert r.num_preemptions == 1 and by_id["low"].preemptions == 1
    # high starts when low has checkpointed (30 s grace), runs 50 s
    assert by_id["high"].first_start == pytest.approx(130.0)
    assert by_id["high"].finish == pytest.approx(180.0)
    # low ran 100 s, kept that work, and finishes its other 900 s after high
    assert by_id["low"].finish == pytest.approx(180.0 + 900.0)
    # the grace period is held but not useful
    assert r.allocated_utilization > r.utilization


def test_a_preempted_job_is_not_preempted_again_and_again():
    # a long low job that ages while high jobs keep coming must not ping-pong with them
    hour = 3600.0
    trace = [
        TraceJob("normal", 0.0, 1, 8, 50 * hour, est_duration=50 * hour),
        TraceJob("low", 1.0, 1, 8, 100 * hour, priority="low", est_duration=100 * hour),
    ]
    trace += [
        TraceJob(
            f"high{k}", 60 * hour + k * 10 * hour, 1, 8, hour, priority="high", est_duration=hour
        )  # fmt: skip
        for k in range(10)
    ]
    r = simulate(trace, gpu_nodes(1))
    by_id = {o.job_id: o for o in r.outcomes}
    assert 1 <= by_id["low"].preemptions <= 10  # at most once per high job
    assert r.num_preemptions <= 10


def test_a_job_that_ends_during_its_grace_period_simply_completes():
    inv = gpu_nodes(1)
    trace = [
        TraceJob("low", 0.0, 1, 8, 110.0, priority="low", est_duration=110.0),
        TraceJob("high", 100.0, 1, 8, 50.0, priority="high", est_duration=50.0),
    ]
    by_id = {o.job_id: o for o in simulate(trace, inv, grace_s=30.0).outcomes}
    assert by_id["low"].finish == pytest.approx(110.0)
    assert by_id["high"].first_start == pytest.approx(110.0)


def test_fifo_head_of_line_blocking_and_air_backfill():
    inv = gpu_nodes(2)
    trace = [
        TraceJob("run", 0.0, 1, 8, 1000.0, est_duration=1000.0),
        TraceJob("big", 1.0, 2, 8, 100.0, est_duration=100.0),
        TraceJob("small", 2.0, 1, 8, 100.0, est_duration=100.0),
    ]
    fifo = {o.job_id: o for o in simulate(trace, inv, scheduler="fifo").outcomes}
    air = {o.job_id: o for o in simulate(trace, inv, scheduler="air").outcomes}
    assert fifo["small"].first_start == pytest.approx(1100.0)  # behind big
    assert air["small"].first_start == pytest.approx(2.0)  # backfilled
    assert air["big"].first_start == pytest.approx(fifo["big"].first_start)  # not delayed


def test_a_job_that_can_never_start_stops_the_replay():
    with pytest.raises(SimulationError, match="never start"):
        simulate([TraceJob("huge", 0.0, 4, 8, 10.0)], gpu_nodes(2))


def test_duplicate_ids_and_unknown_scheduler_are_rejected():
    job = TraceJob("a", 0.0, 1, 1, 1.0)
    with pytest.raises(ValueError, match="unique"):
        simulate([job, job], gpu_nodes(1))
    with pytest.raises(ValueError, match="'air' or 'fifo'"):
        simulate([job], gpu_nodes(1), scheduler="lottery")  # type: ignore[arg-type]


def test_cpu_only_cluster_counts_slots():
    inv = [NodeSpec("c0", 4), NodeSpec("c1", 4)]
    trace = [TraceJob(f"j{i}", float(i), 1, 0, 10.0, slots_per_node=2) for i in range(6)]
    r = simulate(trace, inv, policy=SchedulerPolicy())
    assert len(r.outcomes) == 6 and 0 < r.utilization <= 1


def test_fairness_measures():
    assert fair_shares({"a": 2, "b": 10, "c": 10}, 12) == {"a": 2, "b": 5.0, "c": 5.0}
    assert fair_shares({"a": 10, "b": 10}, 9, {"a": 2}) == {"a": 6.0, "b": 3.0}
    assert jain_index([1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
