"""Read-only aggregates over the whole store: what SLOs are measured from (queue waits,
failed attempts, ended jobs in a window) and what /metrics shows at scrape time (jobs
by state, the database's size). Every query reads an index or a window, never the
whole event log.

Example:
    >>> from air_sdk.schema import JobSpec, JobState
    >>> from air_sdk.store import SqliteStore
    >>> store = SqliteStore(":memory:")
    >>> job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
    >>> _ = store.transition(job.id, JobState.SCHEDULED, "placed")
    >>> [(w.job_id == job.id, w.priority, w.wait_s >= 0) for w in store.queue_waits("default", 0)]
    [(True, 'normal', True)]
    >>> store.jobs_by_state()
    {('default', 'SCHEDULED'): 1}
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from air_sdk.schema import FailureInfo
from air_sdk.store.database import Database

__all__ = ["EndedJob", "FailedAttempt", "QueueWait", "StatsQueries"]


@dataclass(frozen=True)
class QueueWait:
    """One start of a job: when it left the queue and how long it had waited there."""

    job_id: str
    tenant: str
    scheduled_at: float
    wait_s: float
    priority: str
    pool: str


@dataclass(frozen=True)
class FailedAttempt:
    """An attempt that ended in a failure, with when the runner ended it."""

    job_id: str
    tenant: str
    attempt: int
    ended_at: float
    failure: FailureInfo


@dataclass(frozen=True)
class EndedJob:
    job_id: str
    tenant: str
    state: str
    ended_at: float


class StatsQueries:
    """Aggregates for SLOs and metrics; writes nothing."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def queue_waits(self, tenant: str | None, since: float) -> list[QueueWait]:
        """Every QUEUED -> SCHEDULED move at or after `since` (a requeued job counts once
        per start), of `tenant`'s jobs (None: every tenant's)."""
        where, args = _tenant_filter(tenant)
        rows = self._db.read(
            "SELECT job_id, tenant, ts, wait, priority, pool FROM ("
            " SELECT e.job_id, j.tenant, e.ts, json_extract(e.data, '$.state') AS state,"
            "  LAG(json_extract(e.data, '$.state')) OVER w AS prev,"
            "  e.ts - LAG(e.ts) OVER w AS wait,"
            "  COALESCE(json_extract(j.spec, '$.priority'), 'normal') AS priority,"
            "  COALESCE(json_extract(j.spec, '$.pool'), 'default') AS pool"
            " FROM jobs j JOIN events e ON e.job_id = j.id AND e.type = 'state'"
            # a job scheduled since `since` was updated since then
            f" WHERE j.updated_at >= ?{where}"
            " WINDOW w AS (PARTITION BY e.job_id ORDER BY e.seq))"
            " WHERE state = 'SCHEDULED' AND prev = 'QUEUED' AND ts >= ? ORDER BY ts",
            (since, *args, since),
        )
        return [
            QueueWait(r["job_id"], r["tenant"], r["ts"], r["wait"], r["priority"], r["pool"])
            for r in rows
        ]

    def failed_attempts(self, tenant: str | None, since: float) -> list[FailedAttempt]:
        """Attempts that ended at or after `since` with a failure record."""
        where, args = _tenant_filter(tenant)
        rows = self._db.read(
            "SELECT a.job_id, j.tenant, a.attempt, a.ended_at, a.failure"
            " FROM jobs j JOIN attempts a ON a.job_id = j.id"
            f" WHERE j.updated_at >= ?{where} AND a.ended_at >= ? AND a.failure IS NOT NULL"
            " ORDER BY a.ended_at",
            (since, *args, since),
        )
        return [
            FailedAttempt(
                r["job_id"],
                r["tenant"],
                r["attempt"],
                r["ended_at"],
                FailureInfo.model_validate_json(r["failure"]),
            )
            for r in rows
        ]

    def ended_jobs(self, tenant: str | None, since: float) -> list[EndedJob]:
        """Jobs that ended at or after `since` after at least one attempt."""
        where, args = _tenant_filter(tenant)
        rows = self._db.read(
            "SELECT id, tenant, state, ended_at FROM jobs j"
            f" WHERE j.updated_at >= ?{where} AND j.ended_at >= ? AND j.attempt > 0"
            " ORDER BY j.ended_at",
            (since, *args, since),
        )
        return [EndedJob(r["id"], r["tenant"], r["state"], r["ended_at"]) for r in rows]

    def jobs_by_state(self) -> dict[tuple[str, str], int]:
        """{(tenant, state): number of jobs}, for every pair that has any."""
        rows = self._db.read("SELECT tenant, state, COUNT(*) AS n FROM jobs GROUP BY tenant, state")
        return {(r["tenant"], r["state"]): r["n"] for r in rows}

    def size_bytes(self) -> int:
        """The database's bytes on disk, its write-ahead log included (0 in memory)."""
        if self._db.memory:
            return 0
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.stat(self._db.path + suffix).st_size
            except FileNotFoundError:
                continue
        return total


def _tenant_filter(tenant: str | None) -> tuple[str, tuple[str, ...]]:
    return ("", ()) if tenant is None else (" AND j.tenant = ?", (tenant,))
