"""Numbered schema migrations (`PRAGMA user_version`): a database written by an older
AIR opens, is migrated once and keeps its rows; a newer one is refused."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from air_sdk.errors import ConfigError
from air_sdk.schema import EventType, JobSpec, JobState, NodeAssignment, Placement, StateChange
from air_sdk.schema.events import LogBatch
from air_sdk.store import SqliteStore, hash_token, migrations
from air_sdk.store.migrations import SCHEMA_VERSION, migrate

# The schema of the first store (commit 2bb639b), as it wrote it.
FIRST_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL REFERENCES tenants(id), role TEXT NOT NULL,
    name TEXT NOT NULL, token_hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL,
    revoked_at REAL);
CREATE TABLE IF NOT EXISTS bundles (
    tenant TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    num_files INTEGER NOT NULL, path TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, sha256));
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL,
    state_reason TEXT NOT NULL DEFAULT '', spec TEXT NOT NULL,
    idem_key TEXT, idem_hash TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, started_at REAL, ended_at REAL,
    attempt INTEGER NOT NULL DEFAULT 0, num_restarts INTEGER NOT NULL DEFAULT 0,
    failure TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0,
    last_seq INTEGER NOT NULL DEFAULT 0, queue_order INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(tenant, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_tenant_created ON jobs(tenant, created_at);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, placement TEXT NOT NULL,
    token_hash TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL,
    reason TEXT NOT NULL DEFAULT '', failure TEXT, resumed_from_step INTEGER,
    PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL, type TEXT NOT NULL,
    attempt INTEGER, rank INTEGER, data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_type ON events(job_id, type, seq);
CREATE TABLE IF NOT EXISTS heartbeats (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    step INTEGER, ts REAL NOT NULL, PRIMARY KEY (job_id, attempt, rank)) WITHOUT ROWID;
"""

# The schema as of commit 2339598, the last before the quota byte counts.
BEFORE_QUOTAS_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL REFERENCES tenants(id), role TEXT NOT NULL,
    name TEXT NOT NULL, token_hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL,
    revoked_at REAL);
CREATE TABLE IF NOT EXISTS bundles (
    tenant TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    num_files INTEGER NOT NULL, path TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, sha256));
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL,
    state_reason TEXT NOT NULL DEFAULT '', spec TEXT NOT NULL,
    idem_key TEXT, idem_hash TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, started_at REAL, ended_at REAL,
    attempt INTEGER NOT NULL DEFAULT 0, num_restarts INTEGER NOT NULL DEFAULT 0,
    charged_restarts INTEGER NOT NULL DEFAULT 0,
    failure TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0,
    last_seq INTEGER NOT NULL DEFAULT 0, queue_order INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(tenant, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_tenant_order ON jobs(tenant, queue_order);
CREATE INDEX IF NOT EXISTS jobs_state_order ON jobs(state, queue_order);
DROP INDEX IF EXISTS jobs_tenant_created;
DROP INDEX IF EXISTS jobs_state;
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, placement TEXT NOT NULL,
    token_hash TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL,
    reason TEXT NOT NULL DEFAULT '', failure TEXT, resumed_from_step INTEGER,
    PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL, type TEXT NOT NULL,
    attempt INTEGER, rank INTEGER, data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_type ON events(job_id, type, seq);
CREATE TABLE IF NOT EXISTS heartbeats (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    step INTEGER, ts REAL NOT NULL, progress_ts REAL,
    PRIMARY KEY (job_id, attempt, rank)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS node_failures (
    node TEXT PRIMARY KEY, count INTEGER NOT NULL, last_ts REAL NOT NULL);
"""

# What the store of commit a229a9d (the last without numbered migrations) made of any
# of those on start: columns added by checks, user_version left at 0.
LAST_UNVERSIONED = (
    BEFORE_QUOTAS_SCHEMA
    + """
ALTER TABLE jobs ADD COLUMN log_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN metric_bytes INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS attempts_token ON attempts(token_hash);
"""
)

OLD_SCHEMAS = {
    "first": FIRST_SCHEMA,
    "before-quotas": BEFORE_QUOTAS_SCHEMA,
    "last-unversioned": LAST_UNVERSIONED,
}

JOB = "mnist-1a2b3c4d"
USER_TOKEN = "air_old-user-token"
WORKER_TOKEN = "airw_old-worker-token"


def _old_database(path, schema: str) -> None:
    """A database as an older AIR left it: its tables, a tenant with a token, a running
    job with an attempt, two events and a heartbeat."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(schema)
    db.execute("INSERT INTO tenants VALUES ('default', 'default', 1.0), ('acme', 'acme', 2.0)")
    db.execute(
        "INSERT INTO tokens VALUES ('t1', 'acme', 'member', 'ci', ?, 3.0, NULL)",
        (hash_token(USER_TOKEN),),
    )
    spec = JobSpec(name="mnist", entrypoint="train.py")
    db.execute(
        "INSERT INTO jobs (id, tenant, name, state, spec, created_at, updated_at, started_at,"
        " attempt, last_seq, queue_order) VALUES (?, 'acme', 'mnist', 'RUNNING', ?, 4.0,"
        " 5.0, 5.0, 1, 2, 7)",
        (JOB, spec.model_dump_json()),
    )
    placement = Placement(job_id=JOB, nodes=(NodeAssignment(node="n0", slots=1),))
    db.execute(
        "INSERT INTO attempts (job_id, attempt, placement, token_hash, started_at)"
        " VALUES (?, 1, ?, ?, 5.0)",
        (JOB, placement.model_dump_json(), hash_token(WORKER_TOKEN)),
    )
    queued = StateChange(state=JobState.QUEUED, reason="submitted").model_dump_json()
    lines = LogBatch(lines=["step 1 loss 2.3"]).model_dump_json()
    db.execute(
        "INSERT INTO events VALUES (?, 1, 4.0, 'state', NULL, NULL, ?),"
        " (?, 2, 6.0, 'log', 1, 0, ?)",
        (JOB, queued, JOB, lines),
    )
    db.execute(
        "INSERT INTO heartbeats (job_id, attempt, rank, step, ts) VALUES (?, 1, 0, 1, 6.0)", (JOB,)
    )
    db.commit()
    db.close()


def _shape(path) -> tuple[dict[str, set[str]], set[str]]:
    """{table: its columns} and the index names: what the store's SQL relies on."""
    db = sqlite3.connect(path)
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    columns = {t: {r[1] for r in db.execute(f"PRAGMA table_info({t})")} for t in tables}
    indexes = {
        r[0]
        for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        if not r[0].startswith("sqlite_autoindex")
    }
    db.close()
    return columns, indexes


def _user_version(path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


@pytest.mark.parametrize("old", sorted(OLD_SCHEMAS))
def test_an_old_database_opens_migrated_with_its_rows(tmp_path, old):
    path = tmp_path / "air.db"
    _old_database(path, OLD_SCHEMAS[old])
    assert _user_version(path) == 0

    store = SqliteStore(path)
    assert _user_version(path) == SCHEMA_VERSION
    # what was there is still there
    assert store.lookup_token(USER_TOKEN) == ("acme", "member")
    assert [t.id for t in store.list_tenants()] == ["default", "acme"]
    job = store.get_job(JOB, tenant="acme")
    assert job is not None and job.state is JobState.RUNNING and job.charged_restarts == 0
    assert store.check_worker_token(JOB, 1, WORKER_TOKEN) == "ok"
    assert [a.placement.nodes[0].node for a in store.list_attempts(JOB)] == ["n0"]
    events = store.read_events(JOB)
    assert [(e.seq, e.type) for e in events] == [(1, EventType.STATE), (2, EventType.LOG)]
    assert events[1].payload_as(LogBatch).lines == ["step 1 loss 2.3"]
    assert store.heartbeats(JOB, 1) == {0: (1, 6.0, None)}
    # and it goes on working: numbers continue, new columns count from 0
    store.append_worker_events(JOB, 1, 0, [LogBatch(lines=["step 2"])], 2, progress=True)
    assert [e.seq for e in store.read_events(JOB)] == [1, 2, 3]
    assert store.heartbeats(JOB, 1)[0][2] is not None
    logged = store._db.read("SELECT log_bytes FROM jobs WHERE id = ?", (JOB,))[0][0]
    assert logged == len(LogBatch(lines=["step 2"]).model_dump_json())
    store.record_node_failure("n0")
    assert store.node_failures()["n0"][0] == 1
    second, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="acme")
    assert [j.id for j in store.list_jobs(tenant="acme")] == [second.id, JOB]
    store.close()


@pytest.mark.parametrize("old", sorted(OLD_SCHEMAS))
def test_a_migrated_database_has_the_shape_of_a_new_one(tmp_path, old):
    _old_database(tmp_path / "old.db", OLD_SCHEMAS[old])
    SqliteStore(tmp_path / "old.db").close()
    SqliteStore(tmp_path / "new.db").close()
    assert _shape(tmp_path / "old.db") == _shape(tmp_path / "new.db")


def test_migrations_run_once(tmp_path):
    path = tmp_path / "air.db"
    c = sqlite3.connect(path, isolation_level=None)
    assert migrate(c, str(path)) == 0
    statements: list[str] = []
    c.set_trace_callback(statements.append)
    assert migrate(c, str(path)) == SCHEMA_VERSION
    assert statements == ["PRAGMA user_version"]  # a look at the number, nothing else
    c.close()


def test_a_database_from_a_newer_air_is_refused(tmp_path):
    path = tmp_path / "air.db"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade"):
        SqliteStore(path)


def test_a_failing_migration_leaves_the_database_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "air.db"
    _old_database(path, BEFORE_QUOTAS_SCHEMA)
    before = _shape(path)

    def broken(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half_done (x)")
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(migrations, "MIGRATIONS", (*migrations.MIGRATIONS, broken))
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        SqliteStore(path)
    assert _user_version(path) == 0 and _shape(path) == before
    monkeypatch.undo()
    assert SqliteStore(path).get_job(JOB) is not None


def test_gateways_opening_a_new_database_at_once_migrate_it_once(tmp_path):
    path = tmp_path / "air.db"
    opened: list[int] = []
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            store = SqliteStore(path)
            opened.append(store._db.opened_at_version)
            store.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # exactly one of them found it new (or all found it done), and the system tenant
    # was created once
    assert sorted(opened)[0] == 0 and opened.count(0) == 1
    assert [t.id for t in SqliteStore(path).list_tenants()] == ["default"]


def test_metrics_stored_as_json_columns_by_version_9_read_as_the_msgpack_ones(tmp_path):
    # Version 9 stored a binary report's columns as JSON text; 10 keeps the msgpack bytes.
    import msgpack

    from air_sdk.schema.columns import PointColumns, to_columns

    store = SqliteStore(tmp_path / "air.db")
    job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
    store.transition(job.id, JobState.SCHEDULED, "placed")
    placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    attempt, _ = store.start_attempt(job.id, placement)
    points = [(1, 1.5, {"loss": 0.5, "lr": float("nan")}), (2, 2.5, {"loss": float("inf")})]
    text = (
        '{"columns":{"names":["loss","lr"],"step":[1,2],"ts":[1.5,2.5],'
        '"values":[[0.5,"Infinity"],["NaN",null]]},"dropped_points":3,"data":null}'
    )
    with store._db.tx() as c:  # a row as version 9 wrote it
        seq = c.execute(
            "UPDATE jobs SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq", (job.id,)
        ).fetchone()[0]
        c.execute(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job.id, seq, 1.0, "metrics", attempt, 0, text),
        )
    raw = msgpack.packb(to_columns(points))
    stored = PointColumns.check(msgpack.unpackb(raw), raw=raw).stored(
        dropped_points=3, data_json="null"
    )
    store.append_worker_events(job.id, attempt, 0, [stored], 2, progress=True)
    kinds = store._db.read(
        "SELECT typeof(data) FROM events WHERE job_id = ? AND type = 'metrics' ORDER BY seq",
        (job.id,),
    )
    assert [k[0] for k in kinds] == ["text", "blob"]
    old, new = [e.data for e in store.read_events(job.id) if e.type is EventType.METRICS]
    assert (
        old
        == new
        == {
            "points": [
                {"step": 1, "ts": 1.5, "values": {"loss": 0.5, "lr": "NaN"}},
                {"step": 2, "ts": 2.5, "values": {"loss": "Infinity"}},
            ],
            "dropped_points": 3,
            "data": None,
        }
    )
    store.close()
