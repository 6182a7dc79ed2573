"""When a failure happened and when the runner noticed (`FailureInfo.failed_at`,
`detected_at`), for every failure the runner detects: a crash (the first failing rank's
exit), a hang (the moment progress stopped), a lost node (its ranks' last report). The
`time_to_detect` SLO measures between the two. Through the controller with the fake
backend of test_controller, and the pure policies on their own."""

from __future__ import annotations

import time

import pytest
from test_controller import make, progress

from air_sdk.runner.backends.base import NodeStatus
from air_sdk.runner.policy import HangPolicy, RankProgress, diagnose
from air_sdk.runner.slo_watch import detection_seconds
from air_sdk.schema import FailureInfo, JobState, RankExit
from air_sdk.store import SqliteStore


@pytest.fixture
def store(tmp_path):
    return SqliteStore(tmp_path / "air.db")


def test_a_crash_is_dated_by_the_first_failing_rank_and_detected_after_it(store, tmp_path):
    ctl, backend = make(store, tmp_path, max_restarts=0)
    ctl.step()
    died = time.time() - 12
    for e in (
        RankExit(rank=0, exit_code=1, ended_at=died + 3),  # its victim
        RankExit(rank=1, exit_code=7, ended_at=died),
    ):
        store.append_worker_events(ctl.job_id, ctl.attempt, e.rank, [e], None)
    backend.attempts[0].exit_codes.update(n1=1)
    before = time.time()
    assert ctl.step() == (JobState.STARTING, JobState.FAILED)
    failure = store.get_job(ctl.job_id).failure
    assert failure.kind == "crash" and failure.failed_at == died
    assert before <= failure.detected_at <= time.time()
    (attempt,) = store.list_attempts(ctl.job_id)
    seconds = detection_seconds(failure, attempt_ended_at=attempt.ended_at)
    assert seconds == failure.detected_at - died and seconds >= 12


def test_a_hang_is_dated_by_when_progress_stopped_and_its_timeout_is_detection(store, tmp_path):
    ctl, backend = make(store, tmp_path, failure={"hang_timeout_s": 5, "backoff_base_s": 0})
    ctl.step()
    now = time.time()
    progress(store, ctl, 0, 10, now - 20)  # rank 0 waits in a collective for rank 1
    progress(store, ctl, 1, 7, now - 30)  # rank 1 stopped first, 30 s ago
    ctl.step()
    ctl._next_progress_check = 0
    assert ctl.step() == (JobState.RUNNING, JobState.FAILED)
    failure = store.get_job(ctl.job_id).failure
    assert failure.kind == "hang" and failure.stalled_ranks == [0, 1]
    assert failure.failed_at == now - 30
    assert failure.detected_at >= now
    assert detection_seconds(failure, attempt_ended_at=time.time()) >= 30


def test_a_lost_node_is_dated_by_the_last_report_of_its_ranks(store, tmp_path):
    ctl, backend = make(store, tmp_path)
    ctl.step()
    now = time.time()
    progress(store, ctl, 0, 5, now - 2)
    progress(store, ctl, 1, 5, now - 40)  # n1's only rank, then nothing: the node died
    backend.attempts[0].exit_codes.update(n1=-9)
    ctl.step()
    failure = store.list_attempts(ctl.job_id)[0].failure
    assert failure.kind == "lost_node" and failure.node == "n1"
    assert failure.failed_at == now - 40 and failure.detected_at >= now


def test_a_lost_node_that_never_reported_cannot_be_dated():
    lost = diagnose(1, [], [], [NodeStatus("n1", 1, lost=True)], {}, last_seen={"n0": 5.0})
    assert lost.kind == "lost_node" and lost.failed_at is None
    assert detection_seconds(lost, attempt_ended_at=20.0) is None


def test_hang_start_is_the_first_stalled_rank_or_the_last_sign_of_life():
    policy = HangPolicy(timeout_s=10)
    ranks = {0: RankProgress(5, 50.0), 1: RankProgress(3, 20.0), 2: RankProgress(9, 95.0)}
    assert policy.stopped_at(ranks, [0, 1]) == 20.0  # rank 2 still moves: not counted
    quiet = {0: RankProgress(active_ts=30.0), 1: RankProgress(active_ts=44.0)}
    # a silent job is alive while any rank is: it stopped at the last sign of anyone's
    assert policy.stopped_at(quiet, [0, 1], silent=True) == 44.0
    assert policy.stopped_at({0: RankProgress()}, [0], silent=True) is None


def test_detection_seconds_for_records_written_before_failed_at():
    # a failure stored by an older gateway: dated by its first failing rank's exit, to
    # the attempt's end
    old = FailureInfo(
        attempt=1,
        reason="rank 0 exit code 3",
        rank_exits=[RankExit(rank=0, exit_code=3, ended_at=100.0), RankExit(rank=1, exit_code=0)],
    )
    assert detection_seconds(old, attempt_ended_at=145.0) == 45.0
    # a verdict the runner dated is used over the attempt's end (which includes teardown)
    dated = old.model_copy(update={"failed_at": 100.0, "detected_at": 110.0})
    assert detection_seconds(dated, attempt_ended_at=145.0) == 10.0
    assert (
        detection_seconds(
            FailureInfo(attempt=1, reason="timeout", kind="timeout"), attempt_ended_at=1.0
        )
        is None
    )
