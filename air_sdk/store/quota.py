"""Per-job storage quotas on the event log: log lines and metric points.

With its worker token a job posted 96 MiB of logs in 1.6 s (issue 14), and nothing
stopped it from filling the disk. Each job now has a byte budget for its `log` and
for its `metrics` events (`JobQuotas`, set from the gateway's options). Past it,
the oldest events of that type are deleted until the job is back under `trim_to` of
its budget, so the newest are kept (as Kubernetes rotates a container's log), and
one `alert` event (kind `quota`) says so the first time.

The bytes counted are those of the stored event data (UTF-8 JSON). The running sums
live in the job's row (`jobs.log_bytes`, `jobs.metric_bytes`), updated by the same
statement that numbers each event, so counting costs nothing on the ingest path and
a restarted gateway reads no event to know where a job stands. Events stored by a
version of AIR from before the counters are not counted.

Example:
    >>> JobQuotas().bytes_for(EventType.LOG) == 128 * MIB
    True
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass

from air_sdk.schema import EventType
from air_sdk.schema.events import Alert

__all__ = ["COUNTED", "MIB", "QUOTA_ALERT", "JobQuotas", "QuotaKeeper", "TrimNeeded", "utf8_len"]

MIB = 1 << 20
#: the alert's `kind`
QUOTA_ALERT = "quota"
#: event types with a byte count in the job's row, and the column that holds it
COUNTED = {EventType.LOG: "log_bytes", EventType.METRICS: "metric_bytes"}
_WHAT = {EventType.LOG: "log lines", EventType.METRICS: "metric points"}
_OPTION = {EventType.LOG: "max_log_bytes_per_job", EventType.METRICS: "max_metric_bytes_per_job"}


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
    #: (a trim holds the store's write lock while it frees the rows: keep each one small)
    trim_to: float = 0.95

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


class TrimNeeded(Exception):
    """Raised by `QuotaKeeper.check` where a trim was not allowed (`may_trim=False`): a
    caller on an event loop, where deleting the oldest events (megabytes) must not run.
    The write that raised it is undone; the caller does it again where it may wait."""


class QuotaKeeper:
    """Trims a job's oldest log or metrics events past its quota. Called by the store
    inside its write transaction (`c`), so a trim and the append that caused it commit
    together."""

    def __init__(self, quotas: JobQuotas) -> None:
        self.quotas = quotas
        self._lock = threading.Lock()
        self._alerted: set[tuple[str, EventType]] = set()

    def check(
        self,
        c: sqlite3.Connection,
        job_id: str,
        etype: EventType,
        used: int,
        *,
        may_trim: bool = True,
    ) -> Alert | None:
        """`used`: the job's stored bytes of `etype`, the event just inserted included.
        Past the quota, deletes the oldest and lowers the count (or raises `TrimNeeded`
        when `may_trim` is False). Returns the alert to append the first time the job is
        trimmed, else None."""
        limit = self.quotas.bytes_for(etype)
        if limit is None or used <= limit:
            return None
        if not may_trim:
            raise TrimNeeded(f"job {job_id} is over its {etype.value} quota")
        freed = _delete_oldest(c, job_id, etype, used - int(limit * self.quotas.trim_to))
        column = COUNTED[etype]
        c.execute(f"UPDATE jobs SET {column} = {column} - ? WHERE id = ?", (freed, job_id))
        key = (job_id, etype)
        with self._lock:
            if key in self._alerted:
                return None
            self._alerted.add(key)
        if _alerted_before(c, job_id, etype):  # by a gateway before a restart
            return None
        detail = (
            f"this job's {_WHAT[etype]} reached their quota of {limit / MIB:g} MiB: the"
            f" oldest are being dropped, the newest kept (gateway option {_OPTION[etype]})"
        )
        return Alert(kind=QUOTA_ALERT, of=etype.value, detail=detail)


def _alerted_before(c: sqlite3.Connection, job_id: str, etype: EventType) -> bool:
    row = c.execute(
        "SELECT 1 FROM events INDEXED BY events_type WHERE job_id = ? AND type = ? AND"
        " json_extract(data, '$.kind') = ? AND json_extract(data, '$.of') = ? LIMIT 1",
        (job_id, EventType.ALERT.value, QUOTA_ALERT, etype.value),
    ).fetchone()
    return row is not None


def _delete_oldest(c: sqlite3.Connection, job_id: str, etype: EventType, at_least: int) -> int:
    """Delete the oldest `etype` events of `job_id` holding at least `at_least` bytes
    (or all of them); returns the bytes deleted. Reads the sizes of those rows only:
    the cursor is stepped lazily (measuring a row reads all of its data)."""
    freed, last_seq = 0, None
    rows = c.execute(
        "SELECT seq, length(CAST(data AS BLOB)) FROM events INDEXED BY events_type"
        " WHERE job_id = ? AND type = ? ORDER BY seq",
        (job_id, etype.value),
    )
    for seq, size in rows:
        freed += size
        last_seq = seq
        if freed >= at_least:
            break
    rows.close()
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
