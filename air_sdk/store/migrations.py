"""The store's schema, as numbered migrations that each run once per database.

A database records the last migration it has had in `PRAGMA user_version`; on
open, `migrate` applies the ones after it, in order, in one transaction with the
new version number, so a crash leaves the old version or the new one, never half.
A database written by a newer AIR (a version above `SCHEMA_VERSION`) is refused
rather than guessed at.

To change the schema, append a migration: never edit one that has shipped, since
databases out there have already run it. A column is added with `ALTER TABLE ...
ADD COLUMN` and a default, so rows written before it read as they did.

Databases from before numbered migrations (up to air-runtime 0.1.0, commit
`a229a9d`) have `user_version` 0 whatever their shape: the store then added
missing columns by checks on every start. So the migrations up to
`_quota_byte_counts` (version 5) tolerate finding their change made already;
later ones need not.

Example:
    >>> import sqlite3
    >>> c = sqlite3.connect(":memory:", isolation_level=None)
    >>> migrate(c, ":memory:"), c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    (0, True)
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from air_sdk.errors import ConfigError

__all__ = ["DEFAULT_TENANT", "MIGRATIONS", "SCHEMA_VERSION", "migrate"]

#: the system tenant, created with the database; its admins manage every tenant
DEFAULT_TENANT = "default"

Migration = Callable[[sqlite3.Connection], None]


def _first_tables(c: sqlite3.Connection) -> None:
    """The tables of the first store (commit 2bb639b), and the system tenant."""
    _run(
        c,
        """
        CREATE TABLE IF NOT EXISTS tenants (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at REAL NOT NULL);
        CREATE TABLE IF NOT EXISTS tokens (
            id TEXT PRIMARY KEY, tenant TEXT NOT NULL REFERENCES tenants(id),
            role TEXT NOT NULL, name TEXT NOT NULL, token_hash TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL, revoked_at REAL);
        CREATE TABLE IF NOT EXISTS bundles (
            tenant TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
            num_files INTEGER NOT NULL, path TEXT NOT NULL, created_at REAL NOT NULL,
            PRIMARY KEY (tenant, sha256));
        CREATE TABLE IF NOT EXISTS jobs (
            id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL,
            state TEXT NOT NULL, state_reason TEXT NOT NULL DEFAULT '', spec TEXT NOT NULL,
            idem_key TEXT, idem_hash TEXT,
            created_at REAL NOT NULL, updated_at REAL NOT NULL, started_at REAL,
            ended_at REAL, attempt INTEGER NOT NULL DEFAULT 0,
            num_restarts INTEGER NOT NULL DEFAULT 0,
            failure TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0,
            last_seq INTEGER NOT NULL DEFAULT 0, queue_order INTEGER NOT NULL);
        CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(tenant, idem_key)
            WHERE idem_key IS NOT NULL;
        CREATE INDEX IF NOT EXISTS jobs_tenant_created ON jobs(tenant, created_at);
        CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
        CREATE TABLE IF NOT EXISTS attempts (
            job_id TEXT NOT NULL, attempt INTEGER NOT NULL, placement TEXT NOT NULL,
            token_hash TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL,
            reason TEXT NOT NULL DEFAULT '', failure TEXT, resumed_from_step INTEGER,
            PRIMARY KEY (job_id, attempt));
        CREATE TABLE IF NOT EXISTS events (
            job_id TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL,
            type TEXT NOT NULL, attempt INTEGER, rank INTEGER, data TEXT NOT NULL,
            PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS events_type ON events(job_id, type, seq);
        CREATE TABLE IF NOT EXISTS heartbeats (
            job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
            step INTEGER, ts REAL NOT NULL,
            PRIMARY KEY (job_id, attempt, rank)) WITHOUT ROWID;
        """,
    )
    c.execute(
        "INSERT OR IGNORE INTO tenants VALUES (?, ?, ?)",
        (DEFAULT_TENANT, DEFAULT_TENANT, time.time()),
    )


def _restart_accounting(c: sqlite3.Connection) -> None:
    """Restarts charged to the job's budget (preemptions are not), the time of a rank's
    last training progress (hang detection), and failures per node (unhealthy nodes)."""
    _add_column(c, "jobs", "charged_restarts", "INTEGER NOT NULL DEFAULT 0")
    _add_column(c, "heartbeats", "progress_ts", "REAL")
    c.execute(
        "CREATE TABLE IF NOT EXISTS node_failures ("
        " node TEXT PRIMARY KEY, count INTEGER NOT NULL, last_ts REAL NOT NULL)"
    )


def _queue_order_indexes(c: sqlite3.Connection) -> None:
    """Job lists read in queue order from an index instead of sorting the history."""
    _run(
        c,
        """
        CREATE INDEX IF NOT EXISTS jobs_tenant_order ON jobs(tenant, queue_order);
        CREATE INDEX IF NOT EXISTS jobs_state_order ON jobs(state, queue_order);
        DROP INDEX IF EXISTS jobs_tenant_created;
        DROP INDEX IF EXISTS jobs_state;
        """,
    )


def _worker_token_index(c: sqlite3.Connection) -> None:
    """The rate limiter tells a real worker token from a guessed one by one lookup."""
    c.execute("CREATE INDEX IF NOT EXISTS attempts_token ON attempts(token_hash)")


def _quota_byte_counts(c: sqlite3.Connection) -> None:
    """Each job's stored log and metric bytes, for its quotas (`air_sdk.store.quota`).
    Events stored before are not counted."""
    _add_column(c, "jobs", "log_bytes", "INTEGER NOT NULL DEFAULT 0")
    _add_column(c, "jobs", "metric_bytes", "INTEGER NOT NULL DEFAULT 0")


def _rank_activity(c: sqlite3.Connection) -> None:
    """The time a rank last showed it was alive (an output line, CPU or GPU use): hangs of
    scripts that never call air.log."""
    _add_column(c, "heartbeats", "active_ts", "REAL")


def _rank_finished(c: sqlite3.Connection) -> None:
    """The time a rank's runtime shut down (`air.shutdown()`): it is leaving, not hung."""
    _add_column(c, "heartbeats", "finished_ts", "REAL")


def _slo_burning(c: sqlite3.Connection) -> None:
    """Which tenants' SLOs are burning now (`air_sdk.store.slo_burns`): a gateway that
    restarts neither writes a burn event again nor misses a recovery."""
    c.execute(
        "CREATE TABLE slo_burning (tenant TEXT NOT NULL, slo TEXT NOT NULL,"
        " since REAL NOT NULL, PRIMARY KEY (tenant, slo)) WITHOUT ROWID"
    )


def _columnar_metrics(c: sqlite3.Connection) -> None:
    """No change of schema: from this version a `metrics` event may hold its points as
    columns (`air_sdk.schema.columns`), which an older AIR would fail to read, so the
    version number makes it refuse the database instead."""


def _binary_metrics(c: sqlite3.Connection) -> None:
    """No change of schema: from this version a `metrics` event of a binary report
    holds its columns as msgpack bytes (`PointColumns.stored`), where version 9 wrote
    them as JSON text (both are read); an older AIR would fail to read them."""


#: every migration, oldest first: the database's version is how many it has had
MIGRATIONS: tuple[Migration, ...] = (
    _first_tables,
    _restart_accounting,
    _queue_order_indexes,
    _worker_token_index,
    _quota_byte_counts,
    _rank_activity,
    _rank_finished,
    _slo_burning,
    _columnar_metrics,
    _binary_metrics,
)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(c: sqlite3.Connection, path: str) -> int:
    """Bring the database on `c` (a connection in autocommit mode) up to
    `SCHEMA_VERSION`; returns the version it had. Safe against another process
    migrating the same file at the same time: the version is read again inside the
    write transaction."""
    found = _version(c)
    _refuse_newer(found, path)
    if found == SCHEMA_VERSION:
        return found
    c.execute("BEGIN IMMEDIATE")
    try:
        found = _version(c)
        _refuse_newer(found, path)
        for migration in MIGRATIONS[found:]:
            migration(c)
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        c.execute("ROLLBACK")
        raise
    c.execute("COMMIT")
    return found


def _version(c: sqlite3.Connection) -> int:
    return int(c.execute("PRAGMA user_version").fetchone()[0])


def _refuse_newer(version: int, path: str) -> None:
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"the database {path} has schema version {version}, written by a newer AIR;"
            f" this one knows versions up to {SCHEMA_VERSION}: upgrade air-runtime, or"
            " start this gateway with another home (`air gateway start --home`, or AIR_HOME)"
        )


def _run(c: sqlite3.Connection, script: str) -> None:
    """Each statement of `script`, inside the caller's transaction (`executescript`
    would commit it first)."""
    for statement in script.split(";"):
        if statement.strip():
            c.execute(statement)


def _add_column(c: sqlite3.Connection, table: str, column: str, decl: str) -> None:
    # A database from before numbered migrations may have the column already.
    columns = {row[1] for row in c.execute(f"PRAGMA table_info({table})")}
    if column not in columns:
        c.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
