"""SloWatch over a real store: samples read from what the store recorded, one `slo` event
per crossing of the threshold, and the three kinds measured as docs/operations.md says."""

from __future__ import annotations

import time

import pytest

from air_sdk.runner.slo_watch import SloWatch
from air_sdk.scheduler import SchedulerPolicy
from air_sdk.scheduler.slo import SloSpec
from air_sdk.schema import (
    EventType,
    FailureInfo,
    JobSpec,
    JobState,
    NodeAssignment,
    Placement,
    RankExit,
    SloBurn,
)
from air_sdk.store import SqliteStore

WAIT = SloSpec(name="wait", kind="queue_wait", target=600, objective=0.5, alert_burned=0.5)


@pytest.fixture
def store(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    store.create_tenant("acme")
    return store


def watch_for(store: SqliteStore, *specs: SloSpec, tenant: str = "acme") -> SloWatch:
    watch = SloWatch(store, SchedulerPolicy(slos={tenant: specs}))
    store.add_transition_listener(watch.on_transition)
    return watch


def submitted(store: SqliteStore, *, tenant: str = "acme", priority: str = "normal") -> str:
    job, _ = store.create_job(JobSpec(entrypoint="t.py", priority=priority), tenant=tenant)
    return job.id


def backdate_queue(store: SqliteStore, job_id: str, seconds: float) -> None:
    """The job entered the queue `seconds` ago (its QUEUED event and its record)."""
    with store._db.tx() as c:
        c.execute("UPDATE events SET ts = ts - ? WHERE job_id = ?", (seconds, job_id))
        c.execute("UPDATE jobs SET updated_at = updated_at - ? WHERE id = ?", (seconds, job_id))


def placed(store: SqliteStore, job_id: str) -> int:
    store.transition(job_id, JobState.SCHEDULED, "placed")
    attempt, _ = store.start_attempt(
        job_id, Placement(job_id=job_id, nodes=(NodeAssignment(node="n0", slots=1),))
    )
    store.transition(job_id, JobState.STARTING, "launched")
    return attempt


def slo_events(store: SqliteStore, job_id: str) -> list[SloBurn]:
    return [e.payload_as(SloBurn) for e in store.read_events(job_id, types=(EventType.SLO,))]


def test_a_burn_is_one_event_on_the_job_that_crossed_the_threshold(store):
    watch = watch_for(store, WAIT)
    fast = submitted(store)
    placed(store, fast)
    slow = submitted(store)
    backdate_queue(store, slow, 900)
    placed(store, slow)  # 1 of 2 starts over 10 min: the whole budget of 50%
    slower = submitted(store)
    backdate_queue(store, slower, 1200)
    placed(store, slower)  # still burning: no second event
    assert slo_events(store, fast) == [] and slo_events(store, slower) == []
    (burn,) = slo_events(store, slow)
    assert (burn.tenant, burn.slo, burn.jobs) == ("acme", "wait", [slow])
    assert burn.burn_rate == pytest.approx(1.0) and burn.budget_left == pytest.approx(0.0)
    (status,) = watch.statuses("acme", time.time())
    assert status.num_samples == 3 and status.burning
    assert [b.job_id for b in status.burned_by] == sorted([slow, slower])
    assert status.value == pytest.approx(900, abs=5)  # the p50 of ~0, 900, 1200


def test_the_priority_filter_and_other_tenants(store):
    store.create_tenant("globex")
    watch = watch_for(
        store, SloSpec(name="hi", kind="queue_wait", target=60, objective=0.9, priority="high")
    )
    low = submitted(store, priority="low")
    backdate_queue(store, low, 900)
    placed(store, low)
    theirs = submitted(store, tenant="globex", priority="high")
    backdate_queue(store, theirs, 900)
    placed(store, theirs)
    (status,) = watch.statuses("acme", time.time())
    assert status.num_samples == 0 and status.budget_left == 1.0
    assert watch.statuses("globex", time.time()) == []  # no SLOs of its own
    assert [s.tenant for s in watch.statuses(None, time.time())] == ["acme"]


def test_time_to_detect_counts_crashes_hangs_and_lost_nodes(store):
    spec = SloSpec(name="detect", kind="time_to_detect", target=30, objective=0.5)
    watch = watch_for(store, spec)
    now = time.time()
    # a crash noticed 2 s after its rank died, a hang noticed at its 60 s timeout after
    # progress stopped (bad: over 30 s), a lost node noticed 10 s after its last report
    failures = {
        "crash": FailureInfo(
            attempt=1,
            reason="rank 0 exit code 3",
            rank_exits=[RankExit(rank=0, exit_code=3, ended_at=now - 102)],
            failed_at=now - 102,
            detected_at=now - 100,
        ),
        "hang": FailureInfo(
            attempt=1, reason="hung", kind="hang", failed_at=now - 160, detected_at=now - 100
        ),
        "lost_node": FailureInfo(
            attempt=1,
            reason="node n1 lost",
            kind="lost_node",
            node="n1",
            failed_at=now - 110,
            detected_at=now - 100,
        ),
        # a timeout is no failure to detect: the runner gives it no date
        "timeout": FailureInfo(attempt=1, reason="ran past its timeout", kind="timeout"),
    }
    jobs = {}
    for kind, failure in failures.items():
        jobs[kind] = job = submitted(store)
        attempt = placed(store, job)
        store.end_attempt(job, attempt, failure.reason, failure)
        store.transition(job, JobState.FAILED, failure.reason, failure=failure)
    (status,) = watch.statuses("acme", time.time())
    assert status.num_samples == 3
    assert status.value == pytest.approx(10)  # the p50 of 2, 10 and 60 s
    assert [b.job_id for b in status.burned_by] == [jobs["hang"]]
    # 1 bad of 3 over a budget of 50%: two thirds of it spent, past the threshold, and
    # the event was written on the job whose failure crossed it
    assert status.burning and status.budget_left == pytest.approx(1 - (1 / 3) / 0.5)
    assert [b.slo for b in slo_events(store, jobs["hang"])] == ["detect"]


def test_time_to_detect_reads_failures_stored_before_they_were_dated(store):
    spec = SloSpec(name="detect", kind="time_to_detect", target=30, objective=0.9)
    watch = watch_for(store, spec)
    job = submitted(store)
    attempt = placed(store, job)
    died = time.time() - 45  # the rank died 45 s before the runner ended the attempt
    crash = FailureInfo(
        attempt=attempt,
        reason="rank 0 exit code 3",
        rank_exits=[RankExit(rank=0, exit_code=3, ended_at=died)],
    )
    store.end_attempt(job, attempt, crash.reason, crash)
    (status,) = watch.statuses("acme", time.time())
    assert status.num_samples == 1 and status.value == pytest.approx(45, abs=2)


def test_goodput_of_ended_jobs(store):
    spec = SloSpec(name="goodput", kind="goodput", target=0.9, objective=0.9)
    watch = watch_for(store, spec)
    job = submitted(store)
    attempt = placed(store, job)
    store.transition(job, JobState.RUNNING, "up")
    # nothing kept: all of it lost (an attempt left open would count as still running)
    store.end_attempt(job, attempt, "crashed")
    store.transition(job, JobState.FAILED, "crashed")
    never_ran = submitted(store)
    store.request_cancel(never_ran)
    (status,) = watch.statuses("acme", time.time())
    assert status.num_samples == 1 and status.value is not None and status.value < 0.5
    assert status.burning
    assert [b.slo for b in slo_events(store, job)] == ["goodput"]


def test_queue_notes_name_waiting_jobs_of_tenants_at_risk(store):
    watch = watch_for(store, SloSpec(name="wait", kind="queue_wait", target=600, objective=0.95))
    old = submitted(store)
    backdate_queue(store, old, 400)
    new = submitted(store)
    jobs = {j.id: j for j in store.list_jobs(states=(JobState.QUEUED,))}
    notes = watch.queue_notes(jobs.values(), time.time())
    assert set(notes) == {old}
    assert "SLO 'wait' (p95 queue wait under 10 min) is at risk" in notes[old]
    assert new not in notes


def test_which_slos_burn_survives_a_restart_of_the_watch(store, tmp_path):
    """The memory of "already burning" is the store's: a watch over the database
    reopened (a restarted gateway) writes no second burn, and does write the recovery."""
    watch_for(store, WAIT)
    slow = submitted(store)
    backdate_queue(store, slow, 900)
    placed(store, slow)  # 1 of 1 starts over 10 min: burning
    assert [b.burning for b in slo_events(store, slow)] == [True]
    store.close()

    again = SqliteStore(tmp_path / "air.db")
    assert again.burning_slos().keys() == {("acme", "wait")}
    watch_for(again, WAIT)
    fast = submitted(again)
    placed(again, fast)  # 1 of 2 bad: the whole budget of 50% spent, still burning
    assert slo_events(again, fast) == []
    recovered_by = None
    for _ in range(3):  # 1 of 3, 1 of 4 bad: still burning; 1 of 5: recovered
        recovered_by = submitted(again)
        placed(again, recovered_by)
    (recovery,) = slo_events(again, recovered_by)
    assert not recovery.burning and recovery.slo == "wait"
    assert recovery.burn_rate == pytest.approx(0.4) and recovery.budget_left == pytest.approx(0.6)
    assert again.burning_slos() == {}
    assert [e.burning for e in slo_events(again, slow)] == [True]  # written once, ever
