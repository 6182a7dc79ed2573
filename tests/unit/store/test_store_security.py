"""The store's own defences (issue 14): file modes of the database, secrets kept for
the reports still accepted after a job ends, per-job quotas."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from air_sdk.schema import JobSpec
from air_sdk.store import SqliteStore


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
