"""The `/ui` web page's job view: a job's snapshot, folded from its event log here and
rendered by the notebook monitor's own renderer (`notebook.snapshot_html`, the chart
by `notebook.chart`): one renderer, two faces.

Snapshots are folded incrementally (each render reads only the events after the last
one folded) and kept for the `MAX_CACHED` most recently viewed jobs; a chart is drawn
again only when the job's events moved on.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from air_sdk.schema import JobRecord, JobSnapshot
from air_sdk.store import SqliteStore

__all__ = ["JobPage", "UiRenderer"]

#: jobs whose folded snapshot (and last chart) are kept
MAX_CACHED = 64
#: events folded per read
READ_BATCH = 5000


@dataclass(frozen=True)
class JobPage:
    """What the page shows of one job: the monitor's HTML, and what the page's own
    controls need (whether it ended; the page asks no more questions of the snapshot)."""

    job_id: str
    state: str
    terminal: bool
    last_seq: int
    html: str


@dataclass
class _Cached:
    snapshot: JobSnapshot
    chart_seq: int = -1
    chart_png: bytes | None = None


class UiRenderer:
    """Folds and renders jobs for the page; thread-safe (routes run in a pool)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, _Cached] = OrderedDict()

    def page(self, job: JobRecord) -> JobPage:
        from air_sdk.notebook.snapshot_html import default_metric, render_html

        with self._lock:
            cached = self._cache.pop(job.id, None) or _Cached(JobSnapshot(job_id=job.id))
            self._cache[job.id] = cached
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
            snapshot = cached.snapshot
            while True:
                events = self._store.read_events(job.id, after=snapshot.last_seq, limit=READ_BATCH)
                for event in events:
                    snapshot.apply(event)
                if len(events) < READ_BATCH:
                    break
            metric = default_metric(snapshot)
            if metric is not None and cached.chart_seq != snapshot.last_seq:
                from air_sdk.notebook.chart import render_chart_png

                cached.chart_png = render_chart_png(snapshot, metric, width_px=720)
                cached.chart_seq = snapshot.last_seq
            html = render_html(snapshot, name=job.name, chart_png=cached.chart_png)
        return JobPage(
            job_id=job.id,
            state=job.state.value,
            terminal=job.state.terminal,
            last_seq=snapshot.last_seq,
            html=html,
        )
