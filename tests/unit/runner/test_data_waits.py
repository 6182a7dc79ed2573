"""Hangs and stragglers named by the ranks' data loading: a rank whose loop waits for a
shard when the hang timeout runs out is reported as "waiting for data (shard X)"."""

import time

import pytest
from test_controller import make, progress

from air_sdk.runner.data_waits import straggler_note
from air_sdk.schema import JobState
from air_sdk.schema.data import DataLoading
from air_sdk.schema.events import MetricsBatch
from air_sdk.store import SqliteStore


@pytest.fixture
def store(tmp_path):
    return SqliteStore(tmp_path / "air.db")


def report_data(store, ctl, rank: int, **totals) -> None:
    data = DataLoading(since=0.0, **totals)
    store.append_worker_events(ctl.job_id, ctl.attempt, rank, [MetricsBatch(data=data)], None)


def test_a_hang_while_waiting_for_a_shard_says_so(store, tmp_path):
    ctl, _ = make(store, tmp_path, failure={"hang_timeout_s": 5, "backoff_base_s": 0})
    ctl.step()
    now = time.time()
    progress(store, ctl, 0, 10, now)
    progress(store, ctl, 1, 7, now - 30)  # rank 1 stopped 30 s ago ...
    report_data(store, ctl, 1, ts=now - 29, waiting_since=now - 29, waiting_shard="s-3.bin")
    report_data(store, ctl, 0, ts=now, num_samples=80)  # rank 0 is not waiting
    assert ctl.step() == (JobState.STARTING, JobState.RUNNING)
    ctl._next_progress_check = 0
    assert ctl.step() == (JobState.RUNNING, JobState.FAILED)
    failure = store.get_job(ctl.job_id).failure
    assert failure.kind == "hang" and failure.stalled_ranks == [1]
    assert "rank 1 (last step 7, waiting for data (shard s-3.bin)) for 5 s" in failure.reason


def test_a_wait_that_ended_is_not_named(store, tmp_path):
    ctl, _ = make(store, tmp_path, failure={"hang_timeout_s": 5, "backoff_base_s": 0})
    ctl.step()
    now = time.time()
    progress(store, ctl, 0, 10, now)
    progress(store, ctl, 1, 7, now - 30)
    report_data(store, ctl, 1, ts=now - 31, waiting_since=now - 32, waiting_shard="s-3.bin")
    report_data(store, ctl, 1, ts=now - 30, wait_s=2.0)  # the shard came; then it hung
    ctl.step()
    ctl._next_progress_check = 0
    assert ctl.step() == (JobState.RUNNING, JobState.FAILED)
    reason = store.get_job(ctl.job_id).failure.reason
    assert "rank 1 (last step 7) for 5 s" in reason and "waiting for data" not in reason


def test_a_straggler_that_waits_for_data_is_said_to(store, tmp_path):
    ctl, _ = make(store, tmp_path)
    report_data(store, ctl, 1, ts=10.0, num_samples=10, wait_s=1.0)
    report_data(store, ctl, 1, ts=20.0, num_samples=20, wait_s=8.0)
    assert straggler_note(store, ctl.job_id, ctl.attempt, 1) == (
        "; it waits for data 70% of the time"
    )
    assert straggler_note(store, ctl.job_id, ctl.attempt, 0) == ""  # it counts nothing
    report_data(store, ctl, 1, ts=21.0, num_samples=20, wait_s=9.0, waiting_since=20.5)
    assert straggler_note(store, ctl.job_id, ctl.attempt, 1) == "; it is waiting for data"
