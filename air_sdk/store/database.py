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

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from air_sdk.store.migrations import migrate

__all__ = ["Database"]

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
        self._local = threading.local()
        if not self.memory:
            _private_files(Path(self.path))
        self._writer = self._connect()
        with self._write_lock:
            # the schema version the file had (0: new, or from before numbered migrations)
            self.opened_at_version = migrate(self._writer, self.path)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
        _switch_to_wal(conn)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
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
        rolled back if it raises."""
        with self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

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
