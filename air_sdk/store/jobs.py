"""Jobs: submitted specs, their state machine and the queue order.

A job's spec is stored with its secret env values replaced by `REDACTED` (the
values live in `air_sdk.store.secret_env`, merged back when a job is read). Every
state change is written with its `state` event in one transaction.

Example:
    >>> from air_sdk.schema import JobSpec
    >>> from air_sdk.store import SqliteStore
    >>> store = SqliteStore(":memory:")
    >>> job, created = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
    >>> created, job.state, store.queue_position(job.id)
    (True, <JobState.QUEUED: 'QUEUED'>, 1)
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from air_sdk.redact import REDACTED, is_secret_env
from air_sdk.schema import FailureInfo, JobRecord, JobSpec, JobState, StateChange
from air_sdk.schema.state import check_transition
from air_sdk.store.attempts import ENDED_GRACE_S, SECRETS_MARGIN_S
from air_sdk.store.database import Database
from air_sdk.store.events import EventLog
from air_sdk.store.secret_env import SecretEnvStore

__all__ = ["ACTIVE_STATES", "IdempotencyConflict", "JobStore", "Transition", "spec_hash"]

log = logging.getLogger(__name__)

#: the states of a job that holds (or is about to hold) a placement
ACTIVE_STATES = (
    JobState.SCHEDULED,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.RESTARTING,
)


def spec_hash(spec: JobSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different body."""


@dataclass(frozen=True)
class Transition:
    """A committed state change, as transition listeners get it: the job after it, the
    state it left and since when it had been in that state."""

    job: JobRecord
    previous: JobState
    previous_since: float


#: called after a state change commits (metrics, SLO checks); never inside its transaction
TransitionListener = Callable[[Transition], None]


class JobStore:
    """Creates, reads and moves jobs; numbers them in submission order."""

    def __init__(self, db: Database, events: EventLog, secrets: SecretEnvStore) -> None:
        self._db = db
        self._events = events
        self._secrets = secrets
        self._queue_order: int = db.read("SELECT COALESCE(MAX(queue_order), 0) FROM jobs")[0][0]
        self._listeners: list[TransitionListener] = []

    def add_transition_listener(self, listener: TransitionListener) -> None:
        """Call `listener` after every committed state change (in the thread that made
        it). It must be quick; an exception it raises is logged, never the caller's."""
        self._listeners.append(listener)

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
        with self._db.tx() as c:
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
            self._events.append(c, job_id, StateChange(state=JobState.QUEUED, reason="submitted"))
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return self._job(row), True

    def get_job(self, job_id: str, tenant: str | None = None) -> JobRecord | None:
        """A job by id; with `tenant`, only if it belongs to that tenant."""
        rows = self._db.read("SELECT * FROM jobs WHERE id = ?", (job_id,))
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
        return [self._job(r) for r in self._db.read(sql, tuple(args))]

    def count_jobs(self, *, tenant: str, states: tuple[JobState, ...]) -> int:
        """How many of `tenant`'s jobs are in one of `states`."""
        marks = ",".join("?" * len(states))
        rows = self._db.read(
            f"SELECT COUNT(*) FROM jobs WHERE tenant = ? AND state IN ({marks})",
            (tenant, *(s.value for s in states)),
        )
        return int(rows[0][0]) if rows else 0

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
            failure = self._events.scrub_failure(job_id, failure)
        with self._db.tx() as c:
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            prev = JobState(row["state"])
            if expect is not None and prev not in expect:
                return None
            check_transition(prev, state)
            prev_since = row["updated_at"]
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
            self._events.append(c, job_id, change, attempt=row["attempt"] or None)
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if state.terminal:
            # Nothing launches an ended job again: its secrets file goes now. Its ranks
            # may still post for ENDED_GRACE_S (see check_worker_token), and what they
            # post must be scrubbed, so the values stay in memory until then.
            self._secrets.retire(job_id, keep_s=ENDED_GRACE_S + SECRETS_MARGIN_S)
        job = self._job(row)
        if self._listeners:
            moved = Transition(job, prev, prev_since)
            for listener in self._listeners:
                try:
                    listener(moved)
                except Exception:  # a metric or an SLO check must never fail a transition
                    log.exception("transition listener %r failed", listener)
        return job

    def request_cancel(self, job_id: str) -> JobRecord:
        """Mark a job for cancellation; a queued job is cancelled at once, an active one by
        the runner (which must stop its processes first)."""
        with self._db.tx() as c:
            c.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
        self.transition(job_id, JobState.CANCELLED, "cancelled by user", expect=(JobState.QUEUED,))
        job = self.get_job(job_id)
        assert job is not None
        return job

    def queue_position(self, job_id: str) -> int | None:
        """1-based position among queued jobs (FIFO by submission), None if not queued."""
        rows = self._db.read(
            "SELECT COUNT(*) FROM jobs WHERE state = 'QUEUED' AND queue_order <= "
            "(SELECT queue_order FROM jobs WHERE id = ? AND state = 'QUEUED')",
            (job_id,),
        )
        n = rows[0][0] if rows else 0
        return n or None

    def _job(self, row: sqlite3.Row) -> JobRecord:
        """A job row as a record, its secret env values merged back (for the runner:
        answers redact them again, see air_sdk.gateway)."""
        secret_env = self._secrets.get(row["id"]) if REDACTED in row["spec"] else {}
        return _job_from_row(row, secret_env)


def _job_from_row(r: sqlite3.Row, secret_env: dict[str, str] | None = None) -> JobRecord:
    # Call JobStore._job instead: it merges the secret env values the row lacks.
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
