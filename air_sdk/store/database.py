"""One SQLite database file: the connections every part of the store shares.

One writer connection behind a lock (SQLite serialises writers anyway) and one
reader connection per thread (WAL lets readers run beside the writer). Every
write goes through `tx()`, one `BEGIN IMMEDIATE` transaction, so a state change
and the event that records it commit together or not at all. The file and its
side files are 0600, and the schema is brought up to date on open
(`air_sdk.store.migrations`).

Example:
    >>> db = Database(":memory:")
    >>> with db.tx() as c:
    ...     _ = c.execute("INSERT INTO tenants VALUES ('acme', 'acme', 0)")
    >>> [r["id"] for r in db.read("SELECT id FROM tenants ORDER BY id")]
    ['acme', 'default']
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from air_sdk.store.migrations import migrate

__all__ = ["Database"]

#: how long a statement waits for another process's write lock
BUSY_TIMEOUT_MS = 30_000
#: SQLite's own default: a commit that leaves more WAL pages than this checkpoints
AUTOCHECKPOINT_PAGES = 1000
#: the sleeps between tries of a write lock another process holds (SQLite's own)
_BUSY_DELAYS_MS = (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100)
#: what SQLite keeps beside a database in WAL mode (and the rollback journal)
_SIDE_FILES = ("-wal", "-shm", "-journal")


class Database:
    """The shared connections to one database (`":memory:"`: one connection in all).

    Opening migrates the schema (`PRAGMA user_version`); a database written by a newer
    AIR is refused with a `ConfigError`.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.memory = self.path == ":memory:"
        self._write_lock = threading.RLock()
        self._savepoint_depth = 0  # names them; only the thread holding the lock counts
        self._local = threading.local()
        if not self.memory:
            _private_files(Path(self.path))
        self._writer = self._connect()
        with self._write_lock:
            # the schema version the file had (0: new, or from before numbered migrations)
            self.opened_at_version = migrate(self._writer, self.path)
            # The writer never waits inside SQLite: `_begin` waits (or not) for another
            # process's write lock itself, and once begun nothing else in a write
            # transaction takes a lock. Setting the timeout per transaction instead cost
            # two statements per report (docs/benchmarks.md, "Ingest").
            self._writer.execute("PRAGMA busy_timeout=0")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
        _switch_to_wal(conn)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.row_factory = sqlite3.Row
        return conn

    def reader(self) -> sqlite3.Connection:
        """This thread's reader connection (the writer, for an in-memory database)."""
        if self.memory:
            return self._writer
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the writer connection: committed when the block ends,
        rolled back if it raises. Inside a `batch()` of the same thread it is a
        savepoint of the batch's transaction instead: a block that raises undoes only
        its own writes, and nothing commits before the batch does."""
        with self._write_lock:
            if self._writer.in_transaction:  # only this thread can be in it: we hold the lock
                yield from self._savepoint()
                return
            self._begin(wait=True)
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction around several `tx()` blocks (a group commit): each block is
        a savepoint, so one that raises is undone alone; all commit together when the
        batch ends, or none does if the batch itself raises. Other writers wait for the
        batch, so keep it short.

        Example:
            >>> db = Database(":memory:")
            >>> with db.batch():
            ...     with db.tx() as c:
            ...         _ = c.execute("INSERT INTO tenants VALUES ('a', 'a', 0)")
            ...     try:
            ...         with db.tx() as c:
            ...             _ = c.execute("INSERT INTO tenants VALUES ('b', 'b', 0)")
            ...             raise ValueError("undo b only")
            ...     except ValueError:
            ...         pass
            >>> [r["id"] for r in db.read("SELECT id FROM tenants ORDER BY id")]
            ['a', 'default']
        """
        with self.tx():
            yield

    @contextmanager
    def batch_now(self) -> Iterator[bool]:
        """A `batch()` if one can begin without waiting (yields True), else nothing at
        all (yields False at once): another thread holds the writer, or another process
        the file's write lock. For a caller on an event loop, which must never wait for
        a lock; it hands its writes to a thread instead when this yields False.

        Example:
            >>> db = Database(":memory:")
            >>> with db.batch_now() as began:
            ...     if began:
            ...         with db.tx() as c:
            ...             _ = c.execute("INSERT INTO tenants VALUES ('a', 'a', 0)")
            >>> began, len(db.read("SELECT id FROM tenants"))
            (True, 2)
        """
        if not self._write_lock.acquire(blocking=False):
            yield False
            return
        try:
            # (in a transaction already: this thread is inside a batch)
            began = not self._writer.in_transaction and self._begin(wait=False)
            if not began:
                yield False
                return
            try:
                yield True
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")
        finally:
            self._write_lock.release()

    def _begin(self, *, wait: bool) -> bool:
        """`BEGIN IMMEDIATE` on the writer: True once begun. While another process holds
        the file's write lock: with `wait`, retried as SQLite's own busy handler retries
        (sleeps of 1 ms growing to 100 ms) until `BUSY_TIMEOUT_MS`, then its "database is
        locked" error; without, False at once."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        delays_ms = itertools.chain(_BUSY_DELAYS_MS, itertools.repeat(_BUSY_DELAYS_MS[-1]))
        while True:
            try:
                self._writer.execute("BEGIN IMMEDIATE")
                return True
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if not wait:
                    return False
                if time.monotonic() >= deadline:
                    raise
            time.sleep(min(next(delays_ms) / 1000, max(0.0, deadline - time.monotonic())))

    def checkpoint_in_background(self, interval_s: float = 0.5) -> Callable[[], None]:
        """Take WAL checkpoints off the writers: SQLite runs one inside the COMMIT that
        passes 1,000 pages of log (milliseconds, with an fsync), so a writer on an event
        loop would stall it. From now until the returned function is called, a thread
        checkpoints every `interval_s` on its own connection (PASSIVE: it never blocks a
        writer or a reader), and commits do none."""
        if self.memory:
            return lambda: None
        stop = threading.Event()

        def run() -> None:
            conn = self._connect()
            try:
                while not stop.wait(interval_s):
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    except sqlite3.OperationalError:  # busy now: the next round
                        continue
            finally:
                conn.close()

        with self._write_lock:
            self._writer.execute("PRAGMA wal_autocheckpoint=0")
        thread = threading.Thread(target=run, name="air-wal-checkpoint", daemon=True)
        thread.start()

        def stop_checkpoints() -> None:
            stop.set()
            thread.join(10)
            with self._write_lock:
                try:
                    self._writer.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
                except sqlite3.ProgrammingError:  # closed already
                    pass

        return stop_checkpoints

    def _savepoint(self) -> Iterator[sqlite3.Connection]:
        # Named by depth, so the same few statements are prepared once and cached (a
        # fresh name per savepoint would push the hot statements out of the cache).
        self._savepoint_depth += 1
        name = f"air_{self._savepoint_depth}"
        try:
            self._writer.execute(f"SAVEPOINT {name}")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute(f"ROLLBACK TO {name}")
                self._writer.execute(f"RELEASE {name}")
                raise
            self._writer.execute(f"RELEASE {name}")
        finally:
            self._savepoint_depth -= 1

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """The rows of one query, on this thread's reader."""
        if self.memory:
            with self._write_lock:
                return self._writer.execute(sql, args).fetchall()
        return self.reader().execute(sql, args).fetchall()

    def close(self) -> None:
        with self._write_lock:
            self._writer.close()


def _private_files(db: Path) -> None:
    """Make the database 0600 before SQLite opens it, whatever the umask, and its side
    files too. SQLite creates the -wal, -shm and -journal files later with the mode of
    the database file itself (its unix VFS copies it), so they follow; chmod covers
    files left by an older version of AIR that made them 0644."""
    os.close(os.open(db, os.O_RDWR | os.O_CREAT, 0o600))
    for path in (db, *(db.with_name(db.name + suffix) for suffix in _SIDE_FILES)):
        try:
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
        except FileNotFoundError:
            continue


#: how long opening waits for another connection that is turning a new file to WAL
_WAL_SWITCH_WAIT_S = 30.0


def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """`PRAGMA journal_mode=WAL`, retried while another connection holds the lock: the
    switch of a new file needs it alone, and SQLite answers "database is locked" at
    once (its busy timeout does not cover this), e.g. when two gateways (or a gateway
    and `air gc`) open a fresh home at the same moment."""
    deadline = time.monotonic() + _WAL_SWITCH_WAIT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
