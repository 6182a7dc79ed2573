"""JobSnapshot folding: tokens/s and MFU are first-class series."""

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
