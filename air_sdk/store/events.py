"""Each job's append-only event log, and the worker reports that feed it.

Sequence numbers come from `jobs.last_seq`, raised by the statement that inserts
the event, in the same transaction: they start at 1 and have no gaps (but where a
quota trimmed the oldest logs or metrics, `air_sdk.store.quota`). What is written is
scrubbed of the job's secret env values first. A worker report's events and its
rank's heartbeat are written in one transaction.

Example:
    >>> from air_sdk.schema import JobSpec
    >>> from air_sdk.store import SqliteStore
    >>> store = SqliteStore(":memory:")
    >>> job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
    >>> [e.type.value for e in store.read_events(job.id)]
    ['state']
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from air_sdk.redact import Redactor, secret_values
from air_sdk.schema import Event, EventPayload, EventType, FailureInfo
from air_sdk.schema.columns import COLUMNS_KEY, SerializedMetrics, points_form, stored_data
from air_sdk.schema.events import event_type_of
from air_sdk.schema.numbers import json_data, loads_data
from air_sdk.store.database import Database
from air_sdk.store.quota import COUNTED, QuotaKeeper, utf8_len
from air_sdk.store.secret_env import SecretEnvStore

__all__ = ["EventLog"]


class EventLog:
    """Appends to and reads the event log; keeps the rank heartbeats of worker reports.

    `append` is for the other parts of the store, inside their own transaction (a
    state change and its event commit together)."""

    def __init__(self, db: Database, secrets: SecretEnvStore, quota: QuotaKeeper) -> None:
        self._db = db
        self._secrets = secrets
        self._quota = quota
        # Latest seq per job, so waiters poll memory, not SQL.
        self._last_seq: dict[str, int] = {}

    # ---- writing ------------------------------------------------------------------------

    def append(
        self,
        c: sqlite3.Connection,
        job_id: str,
        payload: EventPayload,
        *,
        attempt: int | None = None,
        rank: int | None = None,
    ) -> int:
        """Append one event inside the caller's transaction `c` (from `Database.tx`),
        scrubbed of the job's secrets; returns its seq."""
        seq = c.execute(
            "UPDATE jobs SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq", (job_id,)
        ).fetchone()[0]
        data = self.job_redactor(job_id).value(json_data(payload))
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
            >>> from air_sdk.schema import Alert, JobSpec
            >>> from air_sdk.store import SqliteStore
            >>> store = SqliteStore(":memory:")
            >>> job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
            >>> store.append_event(job.id, Alert(kind="straggler", rank=3), rank=3)
            2
        """
        with self._db.tx() as c:
            return self.append(c, job_id, payload, attempt=attempt, rank=rank)

    def append_worker_events(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        items: list[EventPayload | SerializedMetrics],
        heartbeat_step: int | None,
        *,
        progress: bool = False,
        active: bool = False,
        finished: bool = False,
        may_trim: bool = True,
    ) -> None:
        """Append a worker report's events (`WorkerReport.payloads()`, already redacted)
        and note the heartbeat, in one transaction. `progress`
        marks a report from the training loop itself (air.log / air.heartbeat), as
        opposed to its supervisor's output lines or device samples: only those count
        against hangs of ranks that log steps. `active` marks a report that shows the
        rank alive otherwise (output lines, CPU or GPU use): hangs of plain scripts. A
        rank's first report counts as activity (it just started). `finished` marks the
        report of a rank whose runtime shut down (it is leaving). A `SerializedMetrics`
        item is a `metrics` event whose JSON was written from a binary report's columns.
        With `may_trim` False, a report that takes the job past a storage quota raises
        `TrimNeeded` instead of deleting the oldest events (see `QuotaKeeper`)."""
        now = time.time()
        with self._db.tx() as c:
            for payload in items:
                data: str | bytes
                if isinstance(payload, SerializedMetrics):
                    etype, data, size = EventType.METRICS, payload.data, len(payload.data)
                else:
                    etype, data = event_type_of(payload), payload.model_dump_json()
                    size = utf8_len(data)
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
                        (size, job_id),
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
                        data,
                    ),
                )
                self._last_seq[job_id] = seq
                if column is not None:
                    alert = self._quota.check(c, job_id, etype, used, may_trim=may_trim)
                    if alert is not None:
                        self.append(c, job_id, alert, attempt=attempt)
            c.execute(
                "INSERT INTO heartbeats"
                " (job_id, attempt, rank, step, ts, progress_ts, active_ts, finished_ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, attempt, rank)"
                " DO UPDATE SET step = COALESCE(excluded.step, step), ts = excluded.ts,"
                " progress_ts = COALESCE(excluded.progress_ts, progress_ts),"
                " active_ts = COALESCE(?, active_ts),"
                " finished_ts = COALESCE(finished_ts, excluded.finished_ts)",
                (
                    job_id,
                    attempt,
                    rank,
                    heartbeat_step,
                    now,
                    now if progress else None,
                    now,
                    now if finished else None,
                    now if progress or active else None,
                ),
            )

    # ---- scrubbing ----------------------------------------------------------------------

    def job_redactor(self, job_id: str, extra: tuple[str, ...] = ()) -> Redactor:
        """Scrubs `job_id`'s secret env values, `extra` values and any AIR token from text."""
        return Redactor([*secret_values(self._secrets.to_scrub(job_id)), *extra])

    def scrub_failure(self, job_id: str, failure: FailureInfo) -> FailureInfo:
        """`failure` without the job's secrets: its log tails and stacks come from the
        job's own output."""
        data = self.job_redactor(job_id).value(failure.model_dump(mode="json"))
        return FailureInfo.model_validate(data)

    # ---- reading ------------------------------------------------------------------------

    def last_seq(self, job_id: str) -> int:
        seq = self._last_seq.get(job_id)
        if seq is None:
            rows = self._db.read("SELECT last_seq FROM jobs WHERE id = ?", (job_id,))
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
                data=_data(r["type"], r["data"]),
            )
            for r in self._db.read(sql, tuple(args))
        ]

    def heartbeats(
        self, job_id: str, attempt: int
    ) -> dict[int, tuple[int | None, float, float | None]]:
        """rank -> (last step, last report time, last progress time or None)."""
        rows = self._db.read(
            "SELECT rank, step, ts, progress_ts FROM heartbeats WHERE job_id = ? AND attempt = ?",
            (job_id, attempt),
        )
        return {r["rank"]: (r["step"], r["ts"], r["progress_ts"]) for r in rows}

    def finished_ranks(self, job_id: str, attempt: int) -> dict[int, float]:
        """rank -> when its runtime shut down (`WorkerReport.finished`), for the ranks
        that did."""
        rows = self._db.read(
            "SELECT rank, finished_ts FROM heartbeats WHERE job_id = ? AND attempt = ?"
            " AND finished_ts IS NOT NULL",
            (job_id, attempt),
        )
        return {r["rank"]: r["finished_ts"] for r in rows}

    def last_active(self, job_id: str, attempt: int) -> dict[int, float]:
        """rank -> the last time it showed it was alive: a step, an output line, CPU or
        GPU use, or its first report."""
        rows = self._db.read(
            "SELECT rank, active_ts FROM heartbeats WHERE job_id = ? AND attempt = ?"
            " AND active_ts IS NOT NULL",
            (job_id, attempt),
        )
        return {r["rank"]: r["active_ts"] for r in rows}


def _data(etype: str, text: str | bytes) -> dict[str, Any]:
    """A stored event's data as readers take it: a `metrics` event stored from a binary
    report's columns (msgpack, `PointColumns.stored`; JSON text before schema version
    10) read as the points a `MetricsBatch` writes."""
    if isinstance(text, bytes):
        return stored_data(text)
    data = loads_data(text)
    return points_form(data) if etype == "metrics" and COLUMNS_KEY in data else data
