"""Per-job storage quotas on the event log: log lines and metric points.

With its worker token a job posted 96 MiB of logs in 1.6 s (issue 14), and nothing
stopped it from filling the disk. Each job now has a byte budget for its `log` and
for its `metrics` events (`JobQuotas`, set from the gateway's options). Past it,
the oldest events of that type are deleted until the job is back under
`trim_to` of its budget, so the newest are kept (as Kubernetes rotates a container's
log), and one `alert` event (kind `quota`) says so the first time.

The bytes counted are those of the stored event data (JSON). Usage is kept in memory
per job and type, read from the database once per gateway process, so the ingest
path adds a dict lookup per event.

Example:
    >>> JobQuotas().bytes_for(EventType.LOG) == 128 * MIB
    True
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass

from air_sdk.schema import EventType

__all__ = ["MIB", "QUOTA_ALERT", "JobQuotas", "QuotaKeeper", "utf8_len"]

MIB = 1 << 20
#: the alert's `kind`
QUOTA_ALERT = "quota"
_WHAT = {EventType.LOG: "log lines", EventType.METRICS: "metric points"}
_OPTION = {EventType.LOG: "max_log_bytes_per_job", EventType.METRICS: "max_metric_bytes_per_job"}
#: rows looked at per query when choosing what to delete
_TRIM_BATCH = 2000


@dataclass(frozen=True, kw_only=True)
class JobQuotas:
    """Bytes of stored event data one job may keep, per kind; None: no limit.

    Example:
        >>> JobQuotas(max_log_bytes=None).bytes_for(EventType.LOG) is None
        True
    """

    #: log lines (`air logs`): the newest are kept past it
    max_log_bytes: int | None = 128 * MIB
    #: metric points (`air metrics`, the charts): the newest are kept past it
    max_metric_bytes: int | None = 256 * MIB
    #: once over, the oldest are deleted until the job is under this share of its quota
    trim_to: float = 0.9

    def __post_init__(self) -> None:
        for name in ("max_log_bytes", "max_metric_bytes"):
            value = getattr(self, name)
            if value is not None and value < MIB:
                raise ValueError(f"{name}={value}: give at least 1 MiB ({MIB}), or None")
        if not 0.1 <= self.trim_to < 1.0:
            raise ValueError(f"trim_to={self.trim_to}: give a share in [0.1, 1)")

    def bytes_for(self, etype: EventType) -> int | None:
        if etype is EventType.LOG:
            return self.max_log_bytes
        if etype is EventType.METRICS:
            return self.max_metric_bytes
        return None


class QuotaKeeper:
    """Counts each job's stored log and metrics bytes and trims the oldest past a
    quota. Called by the store inside its write transactions (`c`), so a trim and the
    append that caused it commit together."""

    def __init__(self, quotas: JobQuotas) -> None:
        self.quotas = quotas
        self._lock = threading.Lock()
        self._used: dict[tuple[str, EventType], int] = {}
        self._alerted: set[tuple[str, EventType]] = set()

    def limited(self, etype: EventType) -> bool:
        return self.quotas.bytes_for(etype) is not None

    def add(
        self, c: sqlite3.Connection, job_id: str, etype: EventType, num_bytes: int
    ) -> dict[str, str] | None:
        """Count `num_bytes` more of `etype` for `job_id` (already inserted); trim if
        over. Returns the data of the alert to append the first time the job is
        trimmed, else None."""
        limit = self.quotas.bytes_for(etype)
        if limit is None:
            return None
        key = (job_id, etype)
        with self._lock:
            used = self._used.get(key)
            if used is None:
                used = _stored_bytes(c, job_id, etype)  # includes this append already
                self._alerted.update([key] if _alerted_before(c, job_id, etype) else [])
            else:
                used += num_bytes
            if used <= limit:
                self._used[key] = used
                return None
            target = int(limit * self.quotas.trim_to)
            self._used[key] = used - _delete_oldest(c, job_id, etype, used - target)
            if key in self._alerted:
                return None
            self._alerted.add(key)
        detail = (
            f"this job's {_WHAT[etype]} reached their quota of {limit / MIB:g} MiB: the"
            f" oldest are being dropped, the newest kept (gateway option {_OPTION[etype]})"
        )
        return {"kind": QUOTA_ALERT, "of": etype.value, "detail": detail}

    def forget(self, job_id: str) -> None:
        """Drop the counts of a job (its events are gone, or will never grow again)."""
        with self._lock:
            for etype in _WHAT:
                self._used.pop((job_id, etype), None)
                self._alerted.discard((job_id, etype))


def _stored_bytes(c: sqlite3.Connection, job_id: str, etype: EventType) -> int:
    row = c.execute(
        "SELECT COALESCE(SUM(length(CAST(data AS BLOB))), 0) FROM events INDEXED BY"
        " events_type WHERE job_id = ? AND type = ?",
        (job_id, etype.value),
    ).fetchone()
    return int(row[0])


def _alerted_before(c: sqlite3.Connection, job_id: str, etype: EventType) -> bool:
    row = c.execute(
        "SELECT 1 FROM events INDEXED BY events_type WHERE job_id = ? AND type = ? AND"
        " json_extract(data, '$.kind') = ? AND json_extract(data, '$.of') = ? LIMIT 1",
        (job_id, EventType.ALERT.value, QUOTA_ALERT, etype.value),
    ).fetchone()
    return row is not None


def _delete_oldest(c: sqlite3.Connection, job_id: str, etype: EventType, at_least: int) -> int:
    """Delete the oldest `etype` events of `job_id` holding at least `at_least` bytes
    (or all of them); returns the bytes deleted."""
    freed, last_seq, after = 0, None, 0
    while freed < at_least:
        rows = c.execute(
            "SELECT seq, length(CAST(data AS BLOB)) FROM events INDEXED BY events_type"
            " WHERE job_id = ? AND type = ? AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, etype.value, after, _TRIM_BATCH),
        ).fetchall()
        if not rows:
            break
        for seq, size in rows:
            freed += size
            last_seq = after = seq
            if freed >= at_least:
                break
    if last_seq is not None:
        c.execute(
            "DELETE FROM events WHERE job_id = ? AND type = ? AND seq <= ?",
            (job_id, etype.value, last_seq),
        )
    return freed


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8, without encoding it when it is ASCII (the usual case).

    Example:
        >>> utf8_len("loss"), utf8_len("é")
        (4, 2)
    """
    return len(text) if text.isascii() else len(text.encode())
