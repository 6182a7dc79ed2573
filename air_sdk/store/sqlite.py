"""SQLite control-plane store: the only code in AIR that speaks SQL.

One writer connection behind a lock (SQLite serialises writers anyway) and one
reader connection per thread (WAL lets readers run beside the writer). Every
state change and every event append happens in one transaction, so a crash
never leaves a job whose state and event log disagree.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from air_sdk.redact import REDACTED, Redactor, is_secret_env, secret_values
from air_sdk.schema import (
    AttemptChange,
    AttemptRecord,
    Event,
    EventPayload,
    EventType,
    FailureInfo,
    JobRecord,
    JobSpec,
    JobState,
    Placement,
    StateChange,
    TenantInfo,
    TokenInfo,
)
from air_sdk.schema.admin import ROLES
from air_sdk.schema.events import event_type_of
from air_sdk.schema.state import check_transition
from air_sdk.store.quota import COUNTED, JobQuotas, QuotaKeeper, utf8_len
from air_sdk.store.secret_env import SecretEnvStore

#: the system tenant, created with the database; its admins manage every tenant
DEFAULT_TENANT = "default"
#: how long after an attempt ended its ranks may still post (last lines, exit records)
ENDED_GRACE_S = 10.0
#: an ended job's secret values stay in memory this much longer than the grace, so the
#: last report accepted (checked a moment before it is scrubbed) still finds them
_SECRETS_MARGIN_S = 5.0

_SCHEMA = """
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
    last_seq INTEGER NOT NULL DEFAULT 0, queue_order INTEGER NOT NULL,
    log_bytes INTEGER NOT NULL DEFAULT 0, metric_bytes INTEGER NOT NULL DEFAULT 0);
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
CREATE INDEX IF NOT EXISTS attempts_token ON attempts(token_hash);
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

ACTIVE_STATES = (
    JobState.SCHEDULED,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.RESTARTING,
)


def hash_token(token: str) -> str:
    """Tokens are stored as sha256 digests; they carry 256 random bits, so no salt is needed."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str = "air") -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def spec_hash(spec: JobSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different body."""


class SqliteStore:
    """Jobs, attempts, events, bundles index, tenants and tokens.

    Example:
        >>> store = SqliteStore(":memory:")
        >>> job, created = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
        >>> created, job.state
        (True, <JobState.QUEUED: 'QUEUED'>)
    """

    def __init__(self, path: str | Path, *, quotas: JobQuotas | None = None) -> None:
        self.path = str(path)
        self._quota = QuotaKeeper(quotas or JobQuotas())
        self._write_lock = threading.RLock()
        self._local = threading.local()
        self._memory = self.path == ":memory:"
        if not self._memory:
            _private_files(Path(self.path))
        self._writer = self._connect()
        # Secret env values never enter the database (see air_sdk.store.secret_env).
        self._secrets = SecretEnvStore(None if self._memory else Path(self.path).parent / "secrets")
        with self._write_lock:
            self._writer.executescript(_SCHEMA)
            columns = {r[1] for r in self._writer.execute("PRAGMA table_info(heartbeats)")}
            if "progress_ts" not in columns:  # a database from before progress tracking
                self._writer.execute("ALTER TABLE heartbeats ADD COLUMN progress_ts REAL")
            columns = {r[1] for r in self._writer.execute("PRAGMA table_info(jobs)")}
            for column in COUNTED.values():  # a database from before the storage quotas
                if column not in columns:
                    self._writer.execute(
                        f"ALTER TABLE jobs ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0"
                    )
            self._writer.execute(
                "INSERT OR IGNORE INTO tenants VALUES (?, ?, ?)",
                (DEFAULT_TENANT, DEFAULT_TENANT, time.time()),
            )
            self._writer.commit()
        self._queue_order = self._writer.execute(
            "SELECT COALESCE(MAX(queue_order), 0) FROM jobs"
        ).fetchone()[0]
        # Latest seq per job, so waiters poll memory, not SQL.
        self._last_seq: dict[str, int] = {}

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.row_factory = sqlite3.Row
        return conn

    def _reader(self) -> sqlite3.Connection:
        if self._memory:
            return self._writer
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        if self._memory:
            with self._write_lock:
                return self._writer.execute(sql, args).fetchall()
        return self._reader().execute(sql, args).fetchall()

    def close(self) -> None:
        with self._write_lock:
            self._writer.close()

    # ---- tokens -------------------------------------------------------------------------

    def create_token(
        self, tenant: str = DEFAULT_TENANT, role: str = "admin", name: str = ""
    ) -> str:
        """Create an API token; the plaintext is returned once and stored only hashed."""
        return self.issue_token(tenant, role, name)[1]

    def issue_token(self, tenant: str, role: str, name: str = "") -> tuple[TokenInfo, str]:
        """A new token of `role` in `tenant`: (its record, the plaintext, shown once).
        Raises KeyError for an unknown tenant, ValueError for an unknown role."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        token = new_token()
        info = TokenInfo(
            id=uuid.uuid4().hex, tenant=tenant, role=role, name=name, created_at=time.time()
        )
        with self._tx() as c:
            if c.execute("SELECT 1 FROM tenants WHERE id = ?", (tenant,)).fetchone() is None:
                raise KeyError(tenant)
            c.execute(
                "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?, NULL)",
                (info.id, tenant, role, name, hash_token(token), info.created_at),
            )
        return info, token

    def lookup_token(self, token: str) -> tuple[str, str] | None:
        """(tenant, role) for a live token, else None.

        The row is found by the sha256 of the token. Timing of that lookup can only
        tell an attacker about digests of guesses they made, not about a stored token
        (finding a token from a digest prefix is a preimage search over 256 bits); the
        final comparison is constant-time anyway."""
        digest = hash_token(token)
        rows = self._read(
            "SELECT tenant, role, token_hash FROM tokens WHERE token_hash = ?"
            " AND revoked_at IS NULL",
            (digest,),
        )
        if not rows or not hmac.compare_digest(rows[0]["token_hash"], digest):
            return None
        return rows[0]["tenant"], rows[0]["role"]

    def token_exists(self, token: str) -> bool:
        """True for a live user token or any worker token (of any attempt): two indexed
        lookups, for the rate limiter to tell a real token from a guessed one.

        Example:
            >>> store = SqliteStore(":memory:")
            >>> store.token_exists(store.create_token()), store.token_exists("air_guess")
            (True, False)
        """
        digest = hash_token(token)
        rows = self._read(
            "SELECT 1 FROM tokens WHERE token_hash = ? AND revoked_at IS NULL"
            " UNION ALL SELECT 1 FROM attempts WHERE token_hash = ? LIMIT 1",
            (digest, digest),
        )
        return bool(rows)

    def list_tokens(
        self, tenant: str | None = None, *, include_revoked: bool = False
    ) -> list[TokenInfo]:
        """Tokens (never their plaintext), oldest first; of one tenant or of all."""
        sql, args = "SELECT * FROM tokens WHERE 1=1", list[Any]()
        if tenant is not None:
            sql += " AND tenant = ?"
            args.append(tenant)
        if not include_revoked:
            sql += " AND revoked_at IS NULL"
        rows = self._read(sql + " ORDER BY created_at, id", tuple(args))
        return [_token_from_row(r) for r in rows]

    def revoke_token(self, token_id: str, tenant: str | None = None) -> TokenInfo | None:
        """Revoke a token at once (its next request is a 401); with `tenant`, only one of
        that tenant. None when there is no such token. Revoking twice is a no-op."""
        with self._tx() as c:
            row = c.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
            if row is None or (tenant is not None and row["tenant"] != tenant):
                return None
            if row["revoked_at"] is None:
                c.execute("UPDATE tokens SET revoked_at = ? WHERE id = ?", (time.time(), token_id))
                row = c.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return _token_from_row(row)

    # ---- tenants ------------------------------------------------------------------------

    def create_tenant(self, tenant: str) -> TenantInfo | None:
        """A new tenant; None if it exists already."""
        now = time.time()
        with self._tx() as c:
            cur = c.execute("INSERT OR IGNORE INTO tenants VALUES (?, ?, ?)", (tenant, tenant, now))
            if cur.rowcount == 0:
                return None
        return TenantInfo(id=tenant, created_at=now)

    def get_tenant(self, tenant: str) -> TenantInfo | None:
        rows = self._read("SELECT id, created_at FROM tenants WHERE id = ?", (tenant,))
        return TenantInfo(id=rows[0]["id"], created_at=rows[0]["created_at"]) if rows else None

    def list_tenants(self) -> list[TenantInfo]:
        rows = self._read("SELECT id, created_at FROM tenants ORDER BY created_at, id")
        return [TenantInfo(id=r["id"], created_at=r["created_at"]) for r in rows]

    # ---- bundles ------------------------------------------------------------------------

    def add_bundle(self, tenant: str, sha256: str, size: int, num_files: int, path: str) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT OR IGNORE INTO bundles VALUES (?, ?, ?, ?, ?, ?)",
                (tenant, sha256, size, num_files, path, time.time()),
            )

    def get_bundle(self, tenant: str, sha256: str) -> sqlite3.Row | None:
        rows = self._read("SELECT * FROM bundles WHERE tenant = ? AND sha256 = ?", (tenant, sha256))
        return rows[0] if rows else None

    # ---- jobs ---------------------------------------------------------------------------

    def create_job(
        self, spec: JobSpec, *, tenant: str, idempotency_key: str | None = None
    ) -> tuple[JobRecord, bool]:
        """Persist a QUEUED job and its first event. Returns (job, created).

        The same idempotency key with the same spec returns the existing job
        (created=False); with another spec it raises IdempotencyConflict.
        """
        digest = spec_hash(spec)
        secret_env = {k: v for k, v in spec.env.items() if is_secret_env(k, v)}
        stored = spec
        if secret_env:
            stored = spec.model_copy(
                update={"env": {**spec.env, **dict.fromkeys(secret_env, REDACTED)}}
            )
        with self._tx() as c:
            if idempotency_key is not None:
                row = c.execute(
                    "SELECT * FROM jobs WHERE tenant = ? AND idem_key = ?",
                    (tenant, idempotency_key),
                ).fetchone()
                if row is not None:
                    if row["idem_hash"] != digest:
                        raise IdempotencyConflict(idempotency_key)
                    return self._job(row), False
            now = time.time()
            job_id = f"{spec.name[:24]}-{uuid.uuid4().hex[:8]}"
            self._secrets.put(job_id, secret_env)
            self._queue_order += 1
            c.execute(
                "INSERT INTO jobs (id, tenant, name, state, spec, idem_key, idem_hash,"
                " created_at, updated_at, queue_order) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    job_id,
                    tenant,
                    spec.name,
                    JobState.QUEUED.value,
                    stored.model_dump_json(),
                    idempotency_key,
                    digest,
                    now,
                    now,
                    self._queue_order,
                ),
            )
            self._append(c, job_id, StateChange(state=JobState.QUEUED, reason="submitted"))
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return self._job(row), True

    def get_job(self, job_id: str, tenant: str | None = None) -> JobRecord | None:
        """A job by id; with `tenant`, only if it belongs to that tenant."""
        rows = self._read("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows or (tenant is not None and rows[0]["tenant"] != tenant):
            return None
        return self._job(rows[0])

    def list_jobs(
        self,
        *,
        tenant: str | None = None,
        states: tuple[JobState, ...] | None = None,
        limit: int = 100,
        oldest_first: bool = False,
    ) -> list[JobRecord]:
        sql, args = "SELECT * FROM jobs WHERE 1=1", list[Any]()
        if tenant is not None:
            sql += " AND tenant = ?"
            args.append(tenant)
        if states:
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args.extend(s.value for s in states)
        sql += " ORDER BY queue_order " + ("ASC" if oldest_first else "DESC") + " LIMIT ?"
        args.append(limit)
        return [self._job(r) for r in self._read(sql, tuple(args))]

    def transition(
        self,
        job_id: str,
        state: JobState,
        reason: str = "",
        *,
        failure: FailureInfo | None = None,
        expect: tuple[JobState, ...] | None = None,
        charged: bool = True,
    ) -> JobRecord | None:
        """Move a job to `state` and log the event, atomically. Returns None (and changes
        nothing) when the job is not in one of `expect`; raises on an illegal transition."""
        if failure is not None:
            failure = self._scrub_failure(job_id, failure)
        with self._tx() as c:
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            prev = JobState(row["state"])
            if expect is not None and prev not in expect:
                return None
            check_transition(prev, state)
            now = time.time()
            sets = ["state = ?", "state_reason = ?", "updated_at = ?"]
            args: list[Any] = [state.value, reason, now]
            if state is JobState.RUNNING and row["started_at"] is None:
                sets.append("started_at = ?")
                args.append(now)
            if state.terminal:
                sets.append("ended_at = ?")
                args.append(now)
            if state is JobState.RESTARTING:
                sets.append("num_restarts = num_restarts + 1")
                if charged:
                    sets.append("charged_restarts = charged_restarts + 1")
            if failure is not None:
                sets.append("failure = ?")
                args.append(failure.model_dump_json())
            c.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*args, job_id))
            change = StateChange(state=state, previous=prev, reason=reason, failure=failure)
            self._append(c, job_id, change, attempt=row["attempt"] or None)
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if state.terminal:
            # Nothing launches an ended job again: its secrets file goes now. Its ranks
            # may still post for ENDED_GRACE_S (see check_worker_token), and what they
            # post must be scrubbed, so the values stay in memory until then.
            self._secrets.retire(job_id, keep_s=ENDED_GRACE_S + _SECRETS_MARGIN_S)
        return self._job(row)

    def request_cancel(self, job_id: str) -> JobRecord:
        """Mark a job for cancellation; a queued job is cancelled at once, an active one by
        the runner (which must stop its processes first)."""
        with self._tx() as c:
            c.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
        self.transition(job_id, JobState.CANCELLED, "cancelled by user", expect=(JobState.QUEUED,))
        job = self.get_job(job_id)
        assert job is not None
        return job

    # ---- attempts -----------------------------------------------------------------------

    def start_attempt(
        self, job_id: str, placement: Placement, *, resumed_from_step: int | None = None
    ) -> tuple[int, str]:
        """Open the next attempt; returns (attempt number, its worker token)."""
        token = new_token("airw")
        with self._tx() as c:
            c.execute("UPDATE jobs SET attempt = attempt + 1 WHERE id = ?", (job_id,))
            attempt = c.execute("SELECT attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
            now = time.time()
            c.execute(
                "INSERT INTO attempts (job_id, attempt, placement, token_hash, started_at,"
                " resumed_from_step) VALUES (?,?,?,?,?,?)",
                (
                    job_id,
                    attempt,
                    placement.model_dump_json(),
                    hash_token(token),
                    now,
                    resumed_from_step,
                ),
            )
            started = AttemptChange(
                attempt=attempt,
                phase="started",
                placement=placement,
                resumed_from_step=resumed_from_step,
            )
            self._append(c, job_id, started, attempt=attempt)
        return attempt, token

    def end_attempt(
        self, job_id: str, attempt: int, reason: str, failure: FailureInfo | None = None
    ) -> None:
        if failure is not None:
            failure = self._scrub_failure(job_id, failure)
        with self._tx() as c:
            c.execute(
                "UPDATE attempts SET ended_at = ?, reason = ?, failure = ? WHERE job_id = ?"
                " AND attempt = ? AND ended_at IS NULL",
                (
                    time.time(),
                    reason,
                    failure.model_dump_json() if failure else None,
                    job_id,
                    attempt,
                ),
            )
            ended = AttemptChange(attempt=attempt, phase="ended", reason=reason)
            self._append(c, job_id, ended, attempt=attempt)

    def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        rows = self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,))
        return [
            AttemptRecord(
                job_id=r["job_id"],
                attempt=r["attempt"],
                placement=Placement.model_validate_json(r["placement"]),
                started_at=r["started_at"],
                ended_at=r["ended_at"],
                reason=r["reason"],
                failure=FailureInfo.model_validate_json(r["failure"]) if r["failure"] else None,
                resumed_from_step=r["resumed_from_step"],
            )
            for r in rows
        ]

    def attempt_times(self, job_id: str) -> list[tuple[int, float | None, float | None]]:
        """(attempt, first metrics point time, last checkpoint commit time) per attempt."""
        rows = self._read(
            "SELECT attempt,"
            " MIN(CASE WHEN type = 'metrics' THEN ts END) AS first_progress,"
            " MAX(CASE WHEN type = 'checkpoint' AND json_extract(data, '$.skipped') IS NULL"
            " THEN ts END) AS last_commit"
            " FROM events WHERE job_id = ? AND attempt IS NOT NULL AND type IN"
            " ('metrics', 'checkpoint') GROUP BY attempt",
            (job_id,),
        )
        return [(r["attempt"], r["first_progress"], r["last_commit"]) for r in rows]

    def set_resumed_from(self, job_id: str, attempt: int, step: int | None) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE attempts SET resumed_from_step = ? WHERE job_id = ? AND attempt = ?",
                (step, job_id, attempt),
            )

    def check_worker_token(
        self, job_id: str, attempt: int, token: str, *, ended_grace_s: float = ENDED_GRACE_S
    ) -> str:
        """'ok', 'stale' (fenced: a real token of an older attempt, or of an attempt
        or job that ended more than `ended_grace_s` ago) or 'invalid'.

        The grace lets the last lines and the exit record of a rank that just ended
        arrive: refusing every report once the job ends would lose the lines a failing
        rank printed last (its traceback), the ones a user reads first. So an ended
        job's secret values stay in memory for the grace (`SecretEnvStore.retire`),
        and what arrives is scrubbed like any report. When they are gone before the
        grace is (the gateway restarted in between), the report is refused: it could
        not be scrubbed, and nothing unscrubbed is ever stored."""
        rows = self._read(
            "SELECT a.attempt, a.ended_at, j.attempt AS current, j.ended_at AS job_ended"
            " FROM attempts a JOIN jobs j ON j.id = a.job_id"
            " WHERE a.job_id = ? AND a.token_hash = ?",
            (job_id, hash_token(token)),
        )
        if not rows or rows[0]["attempt"] != attempt:
            return "invalid"
        if rows[0]["current"] != attempt:
            return "stale"
        job_ended = rows[0]["job_ended"]
        # A job can end without its attempt being closed (a runner that lost it):
        # the job's end starts the grace too.
        ends = [t for t in (rows[0]["ended_at"], job_ended) if t is not None]
        if ends and time.time() - min(ends) > ended_grace_s:
            return "stale"
        if job_ended is not None and not self._secrets_at_hand(job_id):
            return "stale"
        return "ok"

    def _secrets_at_hand(self, job_id: str) -> bool:
        """False when the job has secret env values that this store no longer holds."""
        rows = self._read("SELECT spec FROM jobs WHERE id = ?", (job_id,))
        if not rows or REDACTED not in rows[0]["spec"]:
            return True
        env = JobSpec.model_validate_json(rows[0]["spec"]).env
        # A non-secret value that is literally "***" counts too: refusing a late
        # report of such a job after a restart is the safe mistake.
        had_secrets = any(value == REDACTED for value in env.values())
        return not had_secrets or bool(self._secrets.to_scrub(job_id))

    # ---- events -------------------------------------------------------------------------

    def _append(
        self,
        c: sqlite3.Connection,
        job_id: str,
        payload: EventPayload,
        *,
        attempt: int | None = None,
        rank: int | None = None,
    ) -> int:
        seq = c.execute(
            "UPDATE jobs SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq", (job_id,)
        ).fetchone()[0]
        data = self.job_redactor(job_id).value(payload.model_dump(mode="json"))
        c.execute(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                job_id,
                seq,
                time.time(),
                event_type_of(payload).value,
                attempt,
                rank,
                json.dumps(data),
            ),
        )
        self._last_seq[job_id] = seq
        return seq

    def append_event(
        self,
        job_id: str,
        payload: EventPayload,
        *,
        attempt: int | None = None,
        rank: int | None = None,
    ) -> int:
        """Append one event (its type follows from the payload's model); returns its seq.

        Example:
            >>> from air_sdk.schema import Alert
            >>> store = SqliteStore(":memory:")
            >>> job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
            >>> store.append_event(job.id, Alert(kind="straggler", rank=3), rank=3)
            2
        """
        with self._tx() as c:
            return self._append(c, job_id, payload, attempt=attempt, rank=rank)

    def append_worker_events(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        items: list[EventPayload],
        heartbeat_step: int | None,
        *,
        progress: bool = False,
    ) -> None:
        """Append a worker report's events (`WorkerReport.payloads()`, already redacted)
        and note the heartbeat, in one transaction. `progress`
        marks a report from the training loop itself (air.log / air.heartbeat), as
        opposed to its supervisor's output lines or device samples: only those count
        against hangs."""
        now = time.time()
        with self._tx() as c:
            for payload in items:
                etype = event_type_of(payload)
                data_json = payload.model_dump_json()
                column = COUNTED.get(etype)
                if column is None:
                    seq = c.execute(
                        "UPDATE jobs SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq",
                        (job_id,),
                    ).fetchone()[0]
                else:  # the same statement keeps the job's byte count for its quota
                    seq, used = c.execute(
                        f"UPDATE jobs SET last_seq = last_seq + 1, {column} = {column} + ?"
                        f" WHERE id = ? RETURNING last_seq, {column}",
                        (utf8_len(data_json), job_id),
                    ).fetchone()
                c.execute(
                    "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        job_id,
                        seq,
                        now,
                        etype.value,
                        attempt,
                        rank,
                        data_json,
                    ),
                )
                self._last_seq[job_id] = seq
                if column is not None:
                    alert = self._quota.check(c, job_id, etype, used)
                    if alert is not None:
                        self._append(c, job_id, alert, attempt=attempt)
            c.execute(
                "INSERT INTO heartbeats VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, attempt, rank)"
                " DO UPDATE SET step = COALESCE(excluded.step, step), ts = excluded.ts,"
                " progress_ts = COALESCE(excluded.progress_ts, progress_ts)",
                (job_id, attempt, rank, heartbeat_step, now, now if progress else None),
            )

    def heartbeats(
        self, job_id: str, attempt: int
    ) -> dict[int, tuple[int | None, float, float | None]]:
        """rank -> (last step, last report time, last progress time or None)."""
        rows = self._read(
            "SELECT rank, step, ts, progress_ts FROM heartbeats WHERE job_id = ? AND attempt = ?",
            (job_id, attempt),
        )
        return {r["rank"]: (r["step"], r["ts"], r["progress_ts"]) for r in rows}

    # ---- node health --------------------------------------------------------------------

    def record_node_failure(self, node: str) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO node_failures VALUES (?, 1, ?) ON CONFLICT (node) DO UPDATE SET"
                " count = count + 1, last_ts = excluded.last_ts",
                (node, time.time()),
            )

    def node_failures(self) -> dict[str, tuple[int, float]]:
        rows = self._read("SELECT node, count, last_ts FROM node_failures")
        return {r["node"]: (r["count"], r["last_ts"]) for r in rows}

    def clear_node_failures(self, node: str) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM node_failures WHERE node = ?", (node,))

    # ---- secrets ------------------------------------------------------------------------

    def _job(self, row: sqlite3.Row) -> JobRecord:
        """A job row as a record, its secret env values merged back (for the runner:
        answers redact them again, see air_sdk.gateway)."""
        secret_env = self._secrets.get(row["id"]) if REDACTED in row["spec"] else {}
        return _job_from_row(row, secret_env)

    def job_redactor(self, job_id: str, extra: tuple[str, ...] = ()) -> Redactor:
        """Scrubs `job_id`'s secret env values, `extra` values and any AIR token from text."""
        return Redactor([*secret_values(self._secrets.to_scrub(job_id)), *extra])

    def _scrub_failure(self, job_id: str, failure: FailureInfo) -> FailureInfo:
        # Log tails and stacks come from the job's own output: keep its secrets out.
        data = self.job_redactor(job_id).value(failure.model_dump(mode="json"))
        return FailureInfo.model_validate(data)

    def last_seq(self, job_id: str) -> int:
        seq = self._last_seq.get(job_id)
        if seq is None:
            rows = self._read("SELECT last_seq FROM jobs WHERE id = ?", (job_id,))
            seq = rows[0][0] if rows else 0
            self._last_seq[job_id] = seq
        return seq

    def read_events(
        self,
        job_id: str,
        *,
        after: int = 0,
        limit: int = 1000,
        types: tuple[EventType, ...] | None = None,
        rank: int | None = None,
        attempt: int | None = None,
        newest_first: bool = False,
        before: int | None = None,
    ) -> list[Event]:
        # With a type filter, SQLite's planner still picks the primary key and scans
        # every metrics row of the job (92% of a core at 3M points, measured); the
        # (job_id, type, seq) index makes it a range read.
        table = "events INDEXED BY events_type" if types else "events"
        sql, args = f"SELECT * FROM {table} WHERE job_id = ? AND seq > ?", [job_id, after]
        if types:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            args.extend(t.value for t in types)
        if rank is not None:
            sql += " AND rank = ?"
            args.append(rank)
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        if before is not None:
            sql += " AND seq < ?"
            args.append(before)
        sql += f" ORDER BY seq {'DESC' if newest_first else 'ASC'} LIMIT ?"
        args.append(limit)
        return [
            Event(
                seq=r["seq"],
                job_id=r["job_id"],
                ts=r["ts"],
                type=EventType(r["type"]),
                attempt=r["attempt"],
                rank=r["rank"],
                data=json.loads(r["data"]),
            )
            for r in self._read(sql, tuple(args))
        ]

    def queue_position(self, job_id: str) -> int | None:
        """1-based position among queued jobs (FIFO by submission), None if not queued."""
        rows = self._read(
            "SELECT COUNT(*) FROM jobs WHERE state = 'QUEUED' AND queue_order <= "
            "(SELECT queue_order FROM jobs WHERE id = ? AND state = 'QUEUED')",
            (job_id,),
        )
        n = rows[0][0] if rows else 0
        return n or None


#: what SQLite keeps beside a database in WAL mode (and the rollback journal)
_SIDE_FILES = ("-wal", "-shm", "-journal")


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


def _token_from_row(r: sqlite3.Row) -> TokenInfo:
    return TokenInfo(
        id=r["id"],
        tenant=r["tenant"],
        role=r["role"],
        name=r["name"],
        created_at=r["created_at"],
        revoked_at=r["revoked_at"],
    )


def _job_from_row(r: sqlite3.Row, secret_env: dict[str, str] | None = None) -> JobRecord:
    # Call SqliteStore._job instead: it merges the secret env values the row lacks.
    spec = JobSpec.model_validate_json(r["spec"])
    if secret_env:
        spec = spec.model_copy(update={"env": {**spec.env, **secret_env}})
    return JobRecord(
        id=r["id"],
        tenant=r["tenant"],
        name=r["name"],
        state=JobState(r["state"]),
        state_reason=r["state_reason"],
        spec=spec,
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        attempt=r["attempt"],
        num_restarts=r["num_restarts"],
        charged_restarts=r["charged_restarts"],
        failure=FailureInfo.model_validate_json(r["failure"]) if r["failure"] else None,
        cancel_requested=bool(r["cancel_requested"]),
    )
