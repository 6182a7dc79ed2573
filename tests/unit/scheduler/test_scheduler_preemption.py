"""Preemption decisions: fewest, lowest-priority, youngest victims; never equal or higher."""

from __future__ import annotations

from sched_helpers import gpu_nodes, job, running

from air_sdk.scheduler import SchedulerPolicy, SchedulerState, decide
from air_sdk.scheduler.decide import Decision

POLICY = SchedulerPolicy()


def victims(d: Decision) -> list[str]:
    return sorted(p.victim_job_id for p in d.preemptions)


def test_high_job_preempts_the_low_priority_job_not_the_normal_one():
    busy = [
        running("normal", ["n0"], priority="normal", started=50),
        running("low", ["n1"], priority="low", started=10),
    ]
    d = decide([job("urgent", priority="high")], gpu_nodes(2), busy, POLICY, now=100)
    assert victims(d) == ["low"]
    (p,) = d.preemptions
    assert p.for_job_id == "urgent"
    assert p.reason.startswith("preempted for high-priority job urgent")
    assert d.placements == []  # it starts once the victim has checkpointed and exited
    assert "preempting 1 lower-priority job (low) to make room" in d.explanations["urgent"]
    assert d.reservations["default"].nodes == ("n1",)


def test_fewest_victims_win():
    busy = [
        running("a", ["n0"], gpus=4, priority="low", started=50),
        running("b", ["n0"], gpus=4, first_gpu=4, priority="low", started=60),
        running("c", ["n1"], gpus=8, priority="low", started=10),
    ]
    d = decide([job("urgent", priority="high")], gpu_nodes(2), busy, POLICY, now=100)
    assert victims(d) == ["c"]


def test_youngest_victim_among_equals():
    busy = [
        running("old", ["n0"], priority="low", started=10),
        running("young", ["n1"], priority="low", started=90),
    ]
    d = decide([job("urgent", priority="high")], gpu_nodes(2), busy, POLICY, now=100)
    assert victims(d) == ["young"]


def test_gang_preemption_takes_the_minimal_set_of_lowest_priority_first():
    busy = [
        running("low-a", ["n0"], priority="low", started=10),
        running("norm-b", ["n1"], priority="normal", started=80),
        running("norm-c", ["n2"], priority="normal", started=20),
        running("high-d", ["n3"], priority="high", started=90),
    ]
    d = decide([job("urgent", nodes=2, priority="high")], gpu_nodes(4), busy, POLICY, now=100)
    # one low job is not enough: add the youngest normal one, never the high one
    assert victims(d) == ["low-a", "norm-b"]


def test_a_multi_node_victim_that_clears_the_whole_gang_is_one_victim():
    busy = [
        running("wide", ["n0", "n1"], priority="low", started=50),
        running("x", ["n2"], priority="low", started=90),
        running("y", ["n3"], priority="low", started=95),
    ]
    d = decide([job("urgent", nodes=2, priority="high")], gpu_nodes(4), busy, POLICY, now=100)
    assert victims(d) == ["wide"]


def test_never_preempts_equal_or_higher_priority():
    busy = [running("h1", ["n0"], priority="high"), running("h2", ["n1"], priority="high")]
    d = decide([job("urgent", priority="high")], gpu_nodes(2), busy, POLICY, now=100)
    assert d.preemptions == []
    assert d.explanations["urgent"].startswith("needs 1 node with 8 free GPUs")


def test_normal_priority_does_not_preempt_by_default_but_can_be_allowed():
    busy = [running("low", ["n0"], priority="low")]
    q = [job("n", priority="normal")]
    assert decide(q, gpu_nodes(1), busy, POLICY, now=100).preemptions == []
    pol = SchedulerPolicy(preemptor_priorities=frozenset({"high", "normal"}))
    assert victims(decide(q, gpu_nodes(1), busy, pol, now=100)) == ["low"]


def test_preemption_can_be_switched_off():
    busy = [running("low", ["n0"], priority="low")]
    pol = SchedulerPolicy(preemption=False)
    d = decide([job("urgent", priority="high")], gpu_nodes(1), busy, pol, now=100)
    assert d.preemptions == []


def test_non_preemptible_jobs_are_spared():
    from dataclasses import replace

    busy = [replace(running("pinned", ["n0"], priority="low"), preemptible=False)]
    d = decide([job("urgent", priority="high")], gpu_nodes(1), busy, POLICY, now=100)
    assert d.preemptions == []


def test_jobs_already_stopping_are_waited_for_not_preempted_again():
    busy = [
        running("stopping", ["n0"], priority="low", terminating=True),
        running("low", ["n1"], priority="low"),
    ]
    d = decide([job("urgent", priority="high")], gpu_nodes(2), busy, POLICY, now=100)
    assert d.preemptions == []
    assert "waiting for 1 preempted job (stopping) to exit" in d.explanations["urgent"]


def test_lower_priority_jobs_may_not_take_the_room_being_freed():
    busy = [running("low", ["n0"], priority="low")]
    q = [job("urgent", priority="high", at=2), job("other", priority="low", at=1, est=10)]
    d = decide(q, gpu_nodes(1), busy, POLICY, now=100)
    assert victims(d) == ["low"]
    # next cycle, with the victim gone: the high job starts, not the older low one
    d2 = decide(q, gpu_nodes(1), [], POLICY, now=130)
    assert [p.job_id for p in d2.placements] == ["urgent"]


def test_no_victim_set_means_a_plain_reservation():
    busy = [running("low", ["n0"], gpus=4, priority="low", end=50.0)]
    # 2 nodes x 8 GPUs on a 1-node cluster can never fit: never-fit, not preemption
    d = decide([job("huge", nodes=2, priority="high")], gpu_nodes(1), busy, POLICY, now=0)
    assert d.preemptions == [] and "never fits" in d.explanations["huge"]


def test_a_state_kept_between_cycles_prices_victims_by_the_jobs_running_now():
    # SchedulerState remembers each node's clearing set until the node's jobs change
    state = SchedulerState()
    urgent = [job("urgent", priority="high")]
    first = [
        running("low-0", ["n0"], priority="low", started=10),
        running("normal-1", ["n1"], priority="normal", started=20),
    ]
    d = state.decide(urgent, gpu_nodes(2), first, POLICY, now=100)
    assert victims(d) == ["low-0"]
    # low-0 ended and a normal job took n0; a low job now runs on n1 instead
    second = [
        running("normal-0", ["n0"], priority="normal", started=110),
        running("low-1", ["n1"], priority="low", started=115),
    ]
    d = state.decide(urgent, gpu_nodes(2), second, POLICY, now=120)
    assert victims(d) == ["low-1"]
    assert d.reservations["default"].nodes == ("n1",)
    # with no low-priority job left, the youngest normal one goes
    third = [second[0], running("normal-1b", ["n1"], priority="normal", started=125)]
    d = state.decide(urgent, gpu_nodes(2), third, POLICY, now=130)
    assert victims(d) == ["normal-1b"]
