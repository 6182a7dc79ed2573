from air_sdk.runner.accounting import AttemptTimes, account
from air_sdk.schema import AttemptRecord, Placement

P = Placement(job_id="j", nodes=())


def attempt(n, start, end):
    return AttemptRecord(job_id="j", attempt=n, placement=P, started_at=start, ended_at=end)


def test_work_after_the_last_checkpoint_is_lost():
    # attempt 1: starts at 0, first step at 5, checkpoint at 50, killed at 60
    # attempt 2: starts at 62, first step at 67, succeeds at 100
    acc = account(
        [attempt(1, 0, 60), attempt(2, 62, 100)],
        [AttemptTimes(1, 5, 50), AttemptTimes(2, 67, None)],
        job_ended_at=100,
        now=200,
        succeeded=True,
    )
    assert acc.productive_s == {1: 45, 2: 33}
    assert acc.lost_s == {1: 15, 2: 5}
    assert acc.goodput == (45 + 33) / 100


def test_a_failed_attempt_without_checkpoints_kept_nothing():
    acc = account(
        [attempt(1, 0, 30)], [AttemptTimes(1, 2, None)], job_ended_at=30, now=30, succeeded=False
    )
    assert acc.productive_s == {1: 0} and acc.goodput == 0


def test_a_running_attempt_counts_up_to_now():
    acc = account(
        [attempt(1, 0, None)],
        [AttemptTimes(1, 4, None)],
        job_ended_at=None,
        now=10,
        succeeded=False,
    )
    assert acc.productive_s == {1: 6} and acc.goodput == 0.6


def test_a_plain_script_that_succeeded_kept_its_time_from_when_its_ranks_were_up():
    # no step ever logged: attempt 1 (ranks up at 3) crashed at 20 without a checkpoint,
    # attempt 2 (started at 22, ranks up at 24) succeeded at 60
    acc = account(
        [attempt(1, 0, 20), attempt(2, 22, 60)],
        [AttemptTimes(1, None, None, ranks_up_ts=3), AttemptTimes(2, None, None, ranks_up_ts=24)],
        job_ended_at=60,
        now=60,
        succeeded=True,
    )
    assert acc.productive_s == {1: 0, 2: 36}
    assert acc.lost_s == {1: 20, 2: 2}
    assert acc.goodput == 36 / 60


def test_a_job_that_logs_steps_still_counts_from_its_first_step():
    acc = account(
        [attempt(1, 0, 30)],
        [AttemptTimes(1, 10, None, ranks_up_ts=2)],
        job_ended_at=30,
        now=30,
        succeeded=True,
    )
    assert acc.productive_s == {1: 20}
