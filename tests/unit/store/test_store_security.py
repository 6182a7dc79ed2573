"""The store's own defences (issue 14): file modes of the database, secrets kept for
the reports still accepted after a job ends, per-job quotas."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from air_sdk.schema import EventType, JobSpec
from air_sdk.schema.events import LogBatch, MetricPoint, MetricsBatch
from air_sdk.store import JobQuotas, SqliteStore
from air_sdk.store.quota import MIB


@pytest.fixture
def loose_umask():
    old = os.umask(0o022)  # the usual default: new files 0644
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_database_and_its_wal_and_shm_are_private_whatever_the_umask(tmp_path, loose_umask):
    db = tmp_path / "air.db"
    store = SqliteStore(db)
    store.create_job(JobSpec(code="print(1)", env={"API_KEY": "k-1234"}), tenant="default")
    store.list_jobs(tenant="default")  # a reader connection: the -shm is mapped
    files = [db, tmp_path / "air.db-wal", tmp_path / "air.db-shm"]
    assert all(f.exists() for f in files)
    assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
    store.close()


def test_an_old_home_with_a_world_readable_database_is_made_private(tmp_path, loose_umask):
    db = tmp_path / "air.db"
    old = sqlite3.connect(db)
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE t (x)")
    old.execute("INSERT INTO t VALUES (1)")
    old.commit()  # left open: its -wal and -shm stay
    assert _mode(db) == 0o644 and _mode(tmp_path / "air.db-wal") == 0o644
    store = SqliteStore(db)
    for name in ("air.db", "air.db-wal", "air.db-shm"):
        assert _mode(tmp_path / name) == 0o600, name
    store.close()
    old.close()


def test_an_in_memory_store_touches_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    SqliteStore(":memory:").create_job(JobSpec(code="print(1)"), tenant="default")
    assert list(tmp_path.iterdir()) == []


# ---- per-job quotas (issue 14, item 5) ---------------------------------------------------


def _log_report(i: int, line_chars: int = 100_000) -> list:
    return [LogBatch(lines=[f"{i:04d} " + "x" * line_chars])]


def _stored(store, job_id, etype) -> tuple[int, list]:
    rows = store._db.read(
        "SELECT seq, length(CAST(data AS BLOB)) AS n FROM events WHERE job_id = ? AND type = ?"
        " ORDER BY seq",
        (job_id, etype.value),
    )
    return sum(r["n"] for r in rows), [r["seq"] for r in rows]


def _alerts(store, job_id) -> list[dict]:
    events = store.read_events(job_id, types=(EventType.ALERT,))
    return [e.data for e in events if e.data.get("kind") == "quota"]


def test_a_jobs_logs_keep_the_newest_within_their_quota(tmp_path):
    # The probe: a job posted 96 MiB of logs in 1.6 s and all of it was kept.
    store = SqliteStore(tmp_path / "air.db", quotas=JobQuotas(max_log_bytes=MIB))
    job, _ = store.create_job(JobSpec(code="print(1)"), tenant="default")
    for i in range(40):  # 40 x ~100 KB: 4 MB of logs
        store.append_worker_events(job.id, 1, 0, _log_report(i), None)
    used, seqs = _stored(store, job.id, EventType.LOG)
    assert used <= MIB
    lines = [e.data["lines"][0][:4] for e in store.read_events(job.id, types=(EventType.LOG,))]
    assert lines[-1] == "0039" and "0000" not in lines  # the newest kept, the oldest gone
    assert lines == sorted(lines) and len(lines) >= 8
    (alert,) = _alerts(store, job.id)  # said once, not per trim
    assert alert["of"] == "log" and "quota of 1 MiB" in alert["detail"]
    assert "max_log_bytes_per_job" in alert["detail"]
    # a gateway restarted over the same files goes on counting, and does not say it again
    again = SqliteStore(tmp_path / "air.db", quotas=JobQuotas(max_log_bytes=MIB))
    for i in range(40, 50):
        again.append_worker_events(job.id, 1, 0, _log_report(i), None)
    assert _stored(again, job.id, EventType.LOG)[0] <= MIB
    assert len(_alerts(again, job.id)) == 1


def test_metrics_have_their_own_quota_and_other_jobs_are_untouched(tmp_path):

    store = SqliteStore(tmp_path / "air.db", quotas=JobQuotas(max_metric_bytes=MIB))
    noisy, _ = store.create_job(JobSpec(code="print(1)"), tenant="default")
    quiet, _ = store.create_job(JobSpec(code="print(1)"), tenant="default")
    points = [MetricPoint(step=s, ts=0.0, values={"loss": 0.5, "lr": 0.1}) for s in range(2000)]
    report = [MetricsBatch(points=points)]  # ~100 KB
    for _ in range(30):
        store.append_worker_events(noisy.id, 1, 0, report, 1999)
    store.append_worker_events(quiet.id, 1, 0, report, 1999)
    store.append_worker_events(quiet.id, 1, 0, _log_report(0), None)
    assert _stored(store, noisy.id, EventType.METRICS)[0] <= MIB
    assert [a["of"] for a in _alerts(store, noisy.id)] == ["metrics"]
    assert len(_stored(store, quiet.id, EventType.METRICS)[1]) == 1 and not _alerts(store, quiet.id)


def test_no_quota_keeps_everything(tmp_path):
    store = SqliteStore(tmp_path / "air.db", quotas=JobQuotas(max_log_bytes=None))
    job, _ = store.create_job(JobSpec(code="print(1)"), tenant="default")
    for i in range(15):
        store.append_worker_events(job.id, 1, 0, _log_report(i), None)
    assert len(_stored(store, job.id, EventType.LOG)[1]) == 15


def test_quota_options_reject_nonsense():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        JobQuotas(max_log_bytes=1000)
