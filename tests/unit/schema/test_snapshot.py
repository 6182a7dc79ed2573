"""JobSnapshot folding: tokens/s and MFU are first-class series."""

import pytest

from air_sdk.schema import Event, JobSnapshot


def metrics(seq, rank, *points):
    data = {"points": [{"step": s, "ts": float(s), "values": v} for s, v in points]}
    return Event(seq=seq, job_id="j", ts=float(seq), type="metrics", rank=rank, data=data)


def test_tokens_per_s_and_mfu_fold_as_series_from_rank_0():
    snap = JobSnapshot(job_id="j")
    assert snap.tokens_per_s is None and snap.mfu is None
    snap.apply(metrics(1, 0, (1, {"loss": 2.0, "tokens": 4096})))
    snap.apply(metrics(2, 0, (2, {"loss": 1.9, "tokens": 4096, "tokens_per_s": 8e4, "mfu": 0.38})))
    snap.apply(metrics(3, 1, (2, {"loss": 1.8, "tokens_per_s": 1.0, "mfu": 0.99})))  # rank 1
    assert snap.tokens_per_s == 8e4 and snap.mfu == 0.38
    snap.apply(metrics(4, 0, (3, {"loss": 1.7, "tokens": 4096, "tokens_per_s": 9e4, "mfu": 0.41})))
    assert snap.series["tokens_per_s"] == [(2, 8e4), (3, 9e4)]
    assert snap.series["mfu"] == [(2, 0.38), (3, 0.41)]
    assert snap.mfu == 0.41


def _timed(seq, rank, *points):
    data = {"points": [{"step": s, "ts": ts, "values": {"loss": 1.0}} for s, ts in points]}
    return Event(seq=seq, job_id="j", ts=float(seq), type="metrics", rank=rank, data=data)


def test_steps_per_second_is_one_ranks_progress_whatever_order_reports_arrive():
    # Rank 0 ran steps 1-5 at t=10..10.4 before rank 1 even started (t=20..20.4), and rank
    # 1's report reached the gateway first (a loaded machine): a rate from rank 1's first
    # point to rank 0's last would be negative, so it was missing from the summary.
    snap = JobSnapshot(job_id="j")
    snap.apply(_timed(1, 1, *[(s, 20.0 + (s - 1) / 10) for s in range(1, 6)]))
    assert snap.steps_per_second == pytest.approx(10.0)  # rank 1's alone, until rank 0 reports
    snap.apply(_timed(2, 0, *[(s, 10.0 + (s - 1) / 20) for s in range(1, 6)]))
    assert snap.step == 5
    assert snap.steps_per_second == pytest.approx(20.0)  # rank 0's: 4 steps in 0.2 s
    snap.apply(_timed(3, 1, (6, 30.0)))  # a higher rank's later points do not move it
    assert snap.step == 6 and snap.steps_per_second == pytest.approx(20.0)
