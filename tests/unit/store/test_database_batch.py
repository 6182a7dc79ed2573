"""Group commits in the store's `Database`: `batch()` (several `tx()` blocks in one
transaction, each undone alone), `batch_now()` (never waits: False while another thread
or process holds the writer) and WAL checkpoints taken off the writers."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from air_sdk.store import database
from air_sdk.store.database import AUTOCHECKPOINT_PAGES, Database


def _tenants(db: Database) -> list[str]:
    return [r["id"] for r in db.read("SELECT id FROM tenants ORDER BY id")]


def _add(db: Database, name: str) -> None:
    with db.tx() as c:
        c.execute("INSERT INTO tenants VALUES (?, ?, 0)", (name, name))


def test_a_batch_commits_its_blocks_together_and_undoes_a_failing_one_alone(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path / "air.db")
    outside = Database(tmp_path / "air.db")  # another connection: sees only what committed
    with db.batch():
        _add(db, "a")
        with pytest.raises(sqlite3.IntegrityError):
            _add(db, "a")  # a duplicate: this block alone is undone
        _add(db, "b")
        assert _tenants(outside) == ["default"]  # nothing is committed before the batch
    assert _tenants(outside) == ["a", "b", "default"]


def test_a_batch_that_raises_commits_nothing(tmp_path: Path) -> None:
    db = Database(tmp_path / "air.db")
    with pytest.raises(RuntimeError), db.batch():
        _add(db, "a")
        raise RuntimeError("the batch fails")
    assert _tenants(db) == ["default"]
    _add(db, "c")  # and the writer is usable again
    assert _tenants(db) == ["c", "default"]


def test_nested_blocks_in_a_batch_undo_only_their_own_writes(tmp_path: Path) -> None:
    db = Database(tmp_path / "air.db")
    with db.batch(), db.tx() as c:
        c.execute("INSERT INTO tenants VALUES ('outer', 'outer', 0)")
        with pytest.raises(ValueError), db.tx() as inner:
            inner.execute("INSERT INTO tenants VALUES ('inner', 'inner', 0)")
            raise ValueError("undo inner")
    assert _tenants(db) == ["default", "outer"]


def test_batch_now_does_not_wait_for_a_writer_in_another_thread(tmp_path: Path) -> None:
    db = Database(tmp_path / "air.db")
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        with db.tx():
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    assert holding.wait(10)
    try:
        with db.batch_now() as began:
            assert began is False
    finally:
        release.set()
        thread.join(10)
    with db.batch_now() as began:
        assert began is True
        _add(db, "now")
    assert _tenants(db) == ["default", "now"]


def test_batch_now_does_not_wait_for_a_writer_in_another_process(tmp_path: Path) -> None:
    db = Database(tmp_path / "air.db")
    # another process's write transaction holds the file's write lock (as `air gc` could)
    other = sqlite3.connect(tmp_path / "air.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with db.batch_now() as began:
            assert began is False
    finally:
        other.execute("ROLLBACK")
        other.close()
    with db.batch_now() as began:
        assert began is True


def test_a_write_waits_for_a_writer_in_another_process_then_commits(tmp_path: Path) -> None:
    db = Database(tmp_path / "air.db")
    other = sqlite3.connect(tmp_path / "air.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    done = threading.Event()

    def write() -> None:
        _add(db, "waited")
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        assert not done.wait(0.5)  # it waits for the other writer...
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert done.wait(10)  # ...and goes on once that one is done
    thread.join(10)
    assert _tenants(db) == ["default", "waited"]


def test_a_write_gives_up_after_the_busy_timeout_saying_the_database_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "BUSY_TIMEOUT_MS", 300)
    db = Database(tmp_path / "air.db")
    other = sqlite3.connect(tmp_path / "air.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            _add(db, "never")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert _tenants(db) == ["default"]
    _add(db, "later")
    assert _tenants(db) == ["default", "later"]


def test_checkpoints_in_the_background_keep_the_wal_short_and_stop_cleanly(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path / "air.db")
    wal = tmp_path / "air.db-wal"
    stop = db.checkpoint_in_background(interval_s=0.02)
    try:
        # commits take no checkpoint now (a writer on an event loop must not stall)...
        assert db._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        for round_ in range(8):  # 8 x 40 rows of 8 KB: ~2.6 MB of log in all
            for i in range(40):
                with db.tx() as c:
                    c.execute(
                        "INSERT INTO tenants VALUES (?, ?, 0)", (f"t{round_}-{i}", "x" * 8000)
                    )
            threading.Event().wait(0.5)  # the thread checkpoints every 0.02 s
        # ...yet the log is checkpointed and reused: it stays far below what was written
        assert wal.stat().st_size < 1_500_000
    finally:
        stop()
    assert db._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == AUTOCHECKPOINT_PAGES
    assert len(_tenants(db)) == 321
