"""Worker reports checked and parsed on the event loop, then committed in groups: on the
loop when the store is free, else by one writer thread.

Every rank of every job posts a report about twice a second. Handing each report to a
pool thread cost, per report, a thread hand-off each way (two wake-ups and the GIL
passed back and forth): a third of the gateway's CPU per 100-point report, more than
the report's own work (docs/benchmarks.md, "Ingest"). So a report is checked and
parsed (`prepare_report`: token, fencing, body, scrubbing) right on the loop as it
arrives, which answers a refused one (401, 409, 415, 422) at once, and joins the
reports gathered in this turn of the loop. Once the loop has run every request that
was ready, and once more round (`GATHER_TURNS`: each turn reads the sockets, so the
requests that arrived meanwhile join them), they are written in one transaction
(`store_report`, each report its own savepoint), right there when the store's writer
can be had without waiting
(`Database.batch_now`: no other thread holds it, no other process holds the file) and
nothing is queued before them. A commit shares its fixed costs (BEGIN, COMMIT, the
file's header page, the job's row, the heartbeat and index pages) among the reports
that arrived together: under load, the clients whose answers went out together post
again together, so the groups grow by themselves. Committing as soon as the ready
requests had run made groups of 1.6 reports with 4 ranks posting: the others' next
requests were still on their way, and came in one by one while a group was written.
Waiting one more turn of the loop (a poll of the sockets, microseconds for a lone
report; no timer) made them 3.5 (1.9 with 2 ranks, from 1.0) and ingest 14-17% faster
(docs/benchmarks.md, "Issue 23 part 5, fifth pass"). The commit never stalls on a WAL
checkpoint: the gateway takes those in a thread of their own
(`Database.checkpoint_in_background`); and a report that takes its job past a storage
quota, whose trim deletes megabytes of old events, is undone there and handed to the
thread (`TrimNeeded`).

Otherwise the group is queued for the thread, which takes every report queued by then
(up to `max_batch`), writes each inside one transaction, each report its own savepoint
(`Database.batch`), commits once, and wakes the waiting requests with one call per
batch.

A report is answered only after the commit that holds it: a 204 still means stored.
A report that fails while writing (its attempt ended meanwhile: 409) is undone alone
and answered with its own error; if the commit itself fails, every report of it gets
that error and nothing of it is stored. Under light load a group is one report, so
latency is what it was; under heavy load the groups grow and the cost per report
falls.

Example:
    >>> writer = ReportWriter(ctx)  # doctest: +SKIP
    >>> await writer.ingest(job_id, attempt, token, body, "application/msgpack")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from air_sdk.gateway.services.reports import PreparedReport, prepare_report, store_report
from air_sdk.store.quota import TrimNeeded

if TYPE_CHECKING:
    from air_sdk.gateway.app import GatewayContext

__all__ = ["ReportWriter"]

#: the most reports one transaction holds (a batch keeps other writers waiting)
MAX_BATCH = 64
#: turns of the event loop a group of reports waits, after the turn that ran its first
#: one, before it is committed: one, so the requests read by that turn's poll join it
GATHER_TURNS = 1


@dataclass(slots=True)
class _Report:
    prepared: PreparedReport
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


_STOP = object()


class ReportWriter:
    """The gateway's report ingest: `await ingest(...)` returns once the report is
    committed, or raises what `prepare_report` or `store_report` raised for it."""

    def __init__(
        self,
        ctx: GatewayContext,
        *,
        max_batch: int = MAX_BATCH,
        gather_turns: int = GATHER_TURNS,
        store: Callable[..., None] = store_report,
    ) -> None:
        self._ctx = ctx
        self._max_batch = max_batch
        self._gather_turns = gather_turns
        self._store = store
        self._queue: queue.SimpleQueue[_Report | object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: reports handed to the thread and not yet answered (event loop only)
        self._pending = 0
        #: reports gathered in this turn of each loop, to commit together (a gateway has
        #: one loop; a test's clients may each run their own)
        self._gathered: dict[asyncio.AbstractEventLoop, list[_Report]] = {}
        #: transactions the writer thread committed (each holds one or more reports)
        self.committed_batches = 0
        #: transactions committed on the event loop, and the reports they held
        self.loop_commits = 0
        self.loop_reports = 0

    async def ingest(
        self, job_id: str, attempt: int, token: str, body: bytes, content_type: str | None
    ) -> None:
        """Store one rank's report (see `prepare_report` for what it checks): checked and
        parsed now, then committed with the reports that arrived with it."""
        prepared = prepare_report(self._ctx, job_id, attempt, token, body, content_type)
        loop = asyncio.get_running_loop()
        report = _Report(prepared, loop, loop.create_future())
        gathered = self._gathered.get(loop)
        if gathered is None:
            gathered = self._gathered[loop] = []
            loop.call_soon(self._after_turns, loop, self._gather_turns)
        gathered.append(report)
        await report.future

    def _after_turns(self, loop: asyncio.AbstractEventLoop, turns: int) -> None:
        """`_commit_gathered`, once `loop` has gone `turns` more times round."""
        if turns > 0:
            loop.call_soon(self._after_turns, loop, turns - 1)
        else:
            self._commit_gathered(loop)

    def _commit_gathered(self, loop: asyncio.AbstractEventLoop) -> None:
        """On `loop`, once every request that was ready has run: the reports gathered
        meanwhile committed in one transaction, or handed to the thread."""
        gathered = [r for r in self._gathered.pop(loop, []) if not r.future.done()]
        if not gathered:
            return
        # reports before these wait in the thread's queue: these go after them
        later = gathered if self._pending else self._commit_on_loop(gathered)
        for report in later:
            self._hand_to_thread(report)

    def _commit_on_loop(self, gathered: list[_Report]) -> list[_Report]:
        """`gathered` written in one transaction if the store is free now; returns the
        reports left for the thread (all of them when it is not, those whose quota trim
        is for the thread else)."""
        outcomes: list[tuple[_Report, BaseException | None]] = []
        later: list[_Report] = []
        try:
            with self._ctx.store.batch_now() as began:
                if not began:
                    return gathered
                for report in gathered:
                    try:
                        self._store(self._ctx, report.prepared, may_trim=False)
                    except TrimNeeded:  # deleting the job's oldest events is for the thread
                        later.append(report)
                    except Exception as exc:  # this report's own answer; the rest go on
                        outcomes.append((report, exc))
                    else:
                        outcomes.append((report, None))
        except Exception as exc:  # BEGIN or COMMIT failed: nothing of the group is stored
            for_thread = {id(report) for report in later}
            outcomes = [(report, exc) for report in gathered if id(report) not in for_thread]
        else:
            self.loop_commits += 1
            self.loop_reports += len(outcomes)
        _settle(outcomes)
        return later

    def _hand_to_thread(self, report: _Report) -> None:
        self._ensure_thread()
        self._pending += 1
        report.future.add_done_callback(self._answered)
        self._queue.put(report)

    def _answered(self, _future: asyncio.Future[None]) -> None:
        self._pending -= 1

    def stop(self, timeout: float = 10.0) -> None:
        """Ingest what is queued, then end the thread (the app is shutting down; a later
        report starts a new one)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="air-report-writer", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._write([r for r in batch if isinstance(r, _Report)])
            if stop:
                return

    def _write(self, batch: list[_Report]) -> None:
        outcomes: list[tuple[_Report, BaseException | None]] = []
        try:
            with self._ctx.store.batch():
                for report in batch:
                    try:
                        self._store(self._ctx, report.prepared, may_trim=True)
                    except Exception as exc:  # this report's own answer; the rest go on
                        outcomes.append((report, exc))
                    else:
                        outcomes.append((report, None))
            self.committed_batches += 1
        except Exception as exc:  # the commit failed: nothing of the batch is stored
            outcomes = [(report, exc) for report in batch]
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Report, BaseException | None]]] = {}
        for report, outcome in outcomes:
            by_loop.setdefault(report.loop, []).append((report, outcome))
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, settled)
            except RuntimeError:  # that loop is closed: nobody waits any more
                continue


def _settle(settled: list[tuple[_Report, BaseException | None]]) -> None:
    for report, outcome in settled:
        if report.future.done():  # the client went away and the request was cancelled
            continue
        if outcome is None:
            report.future.set_result(None)
        else:
            report.future.set_exception(outcome)
