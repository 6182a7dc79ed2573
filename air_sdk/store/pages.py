"""A job's log lines and metric points, one bounded page at a time.

A job may store up to its quotas (`air_sdk.store.quota`: 128 MiB of logs, 256 MiB
of metrics by default); answering all of it at once made the gateway grow by 518
MiB for one request (issue 14). A page holds whole reports (events) until it has
`max_lines` lines or about `max_bytes` of text (logs), or `max_points` points
(metrics), and at least one report; the caller asks again from where the page
ended (`last_seq`, or a log tail's `first_seq` going back).

Example:
    >>> page = read_log_page(store, "mnist-1a2b3c4d", tail=20)  # doctest: +SKIP
    >>> [line.text for line in page.lines][-1]  # doctest: +SKIP
    'step 999 loss 0.01'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from air_sdk.schema import Event, EventType, LogLine, LogPage, MetricRow, MetricsPage
from air_sdk.schema.events import LogBatch

if TYPE_CHECKING:
    from air_sdk.store.sqlite import SqliteStore

__all__ = [
    "LOG_PAGE_BYTES",
    "LOG_PAGE_LINES",
    "METRIC_PAGE_POINTS",
    "read_log_page",
    "read_metrics_page",
]

#: text per page, about: a page is whole reports (the runtime posts ~1 MiB ones; the cap
#: on one report is `RequestLimits.max_report_bytes`, 4 MiB)
LOG_PAGE_BYTES = 4 << 20
#: lines per page unless the caller asks for fewer (or more, up to the route's maximum)
LOG_PAGE_LINES = 10_000
#: metric points per page unless the caller asks for fewer (or more)
METRIC_PAGE_POINTS = 20_000
#: events read per query while filling a page: few at first (one report can hold
#: megabytes, and a query loads every event it returns), more while they are small
_FIRST_BATCH = 8
_MAX_BATCH = 512


def read_log_page(
    store: SqliteStore,
    job_id: str,
    *,
    after: int = 0,
    before: int | None = None,
    rank: int | None = None,
    attempt: int | None = None,
    tail: int | None = None,
    max_lines: int = LOG_PAGE_LINES,
    max_bytes: int = LOG_PAGE_BYTES,
) -> LogPage:
    """The log lines after `after` (forward), or with `tail` the newest `tail` lines
    before `before`; bounded by `max_lines` (forward) and `max_bytes`."""
    if tail is not None:
        return _tail_page(store, job_id, before, rank, attempt, tail, max_bytes)
    lines: list[LogLine] = []
    num_bytes, first, last, more = 0, 0, after, False
    cursor, batch = after, _FIRST_BATCH
    while not more:
        events = _read(store, job_id, rank, attempt, batch, after=cursor, before=before)
        for event in events:
            texts = _texts(event)
            size = sum(len(t) for t in texts)
            if lines and (len(lines) + len(texts) > max_lines or num_bytes + size > max_bytes):
                more = True
                break
            lines.extend(_lines(event, texts))
            num_bytes += size
            first, last = first or event.seq, event.seq
        if len(events) < batch:
            break
        cursor, batch = events[-1].seq, _next_batch(batch, num_bytes, max_bytes)
    return LogPage(lines=lines, last_seq=last, first_seq=first, more=more)


def _tail_page(
    store: SqliteStore,
    job_id: str,
    before: int | None,
    rank: int | None,
    attempt: int | None,
    tail: int,
    max_bytes: int,
) -> LogPage:
    chunks: list[list[LogLine]] = []  # newest first
    want, num_bytes, first, last, more = tail, 0, 0, 0, False
    cursor, batch = before, _FIRST_BATCH
    while want > 0 and not more:
        events = _read(store, job_id, rank, attempt, batch, before=cursor, newest_first=True)
        for event in events:
            texts = _texts(event)[-want:]
            size = sum(len(t) for t in texts)
            if chunks and num_bytes + size > max_bytes:
                more = True
                break
            chunks.append(_lines(event, texts))
            num_bytes += size
            want -= len(texts)
            first, last = event.seq, last or event.seq
            if want <= 0:
                break
        if len(events) < batch:
            break
        cursor, batch = events[-1].seq, _next_batch(batch, num_bytes, max_bytes)
    lines = [line for chunk in reversed(chunks) for line in chunk]
    return LogPage(lines=lines, last_seq=last, first_seq=first, more=more)


def read_metrics_page(
    store: SqliteStore,
    job_id: str,
    *,
    after: int = 0,
    name: str | None = None,
    rank: int | None = None,
    max_points: int = METRIC_PAGE_POINTS,
) -> MetricsPage:
    """The metric points after `after` (of one `name` and `rank` if given), about
    `max_points` of them in whole reports."""
    rows: list[MetricRow] = []
    last, more, cursor, batch = after, False, after, _FIRST_BATCH
    while not more:
        events = _read(store, job_id, rank, None, batch, after=cursor, etype=EventType.METRICS)
        for event in events:
            new = _rows(event, name)
            if rows and len(rows) + len(new) > max_points:
                more = True
                break
            rows.extend(new)
            last = event.seq
        if len(events) < batch:
            break
        cursor, batch = events[-1].seq, min(2 * batch, _MAX_BATCH)
    return MetricsPage(points=rows, last_seq=last, more=more)


def _rows(event: Event, name: str | None) -> list[MetricRow]:
    return MetricsPage.from_events([event], name=name).points


def _next_batch(batch: int, num_bytes: int, max_bytes: int) -> int:
    """Double the batch while what was read so far is small next to the page."""
    return min(2 * batch, _MAX_BATCH) if num_bytes < max_bytes // 8 else batch


def _read(
    store: SqliteStore,
    job_id: str,
    rank: int | None,
    attempt: int | None,
    batch: int,
    *,
    after: int = 0,
    before: int | None = None,
    newest_first: bool = False,
    etype: EventType = EventType.LOG,
) -> list[Event]:
    return store.read_events(
        job_id,
        after=after,
        before=before,
        types=(etype,),
        rank=rank,
        attempt=attempt,
        limit=batch,
        newest_first=newest_first,
    )


def _texts(event: Event) -> list[str]:
    return event.payload_as(LogBatch).lines


def _lines(event: Event, texts: list[str]) -> list[LogLine]:
    return [LogLine(attempt=event.attempt or 0, rank=event.rank or 0, text=t) for t in texts]
