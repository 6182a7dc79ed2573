"""Worker reports ingested on the event loop when the store is free, else by one writer
thread that commits them in groups.

Every rank of every job posts a report about twice a second. Handing each report to a
pool thread cost, per report, a thread hand-off each way (two wake-ups and the GIL
passed back and forth): a third of the gateway's CPU per 100-point report, more than
the report's own work (docs/benchmarks.md, "Ingest"). So a report is ingested
(`ingest_report`: token, fencing, parsing, scrubbing, the same as before) right on
the loop when the store's writer can be had without waiting (`Database.batch_now`:
no other thread holds it, no other process holds the file) and nothing is queued
before it. Its commit then never stalls on a WAL checkpoint: the gateway takes those
in a thread of their own (`Database.checkpoint_in_background`); and a report that
takes its job past a storage quota, whose trim deletes megabytes of old events, is
undone there and handed to the thread (`TrimNeeded`).

Otherwise the loop queues the report and waits; one thread takes every report queued
by then (up to `max_batch`), ingests each inside one transaction, each report its own
savepoint (`Database.batch`), commits once, and wakes the waiting requests with one
call per batch.

A report is answered only after the commit that holds it: a 204 still means
stored. A report refused (401, 409, 415, 422) or one that fails while writing is
undone alone and answered with its own error; if the commit itself fails, every
report of the batch gets that error and nothing of it is stored. Under light load a
batch is one report, so latency is what it was; under heavy load the batches grow
and the cost per report falls.

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

from air_sdk.gateway.services.reports import ingest_report
from air_sdk.store.quota import TrimNeeded

if TYPE_CHECKING:
    from air_sdk.gateway.app import GatewayContext

__all__ = ["ReportWriter"]

#: the most reports one transaction holds (a batch keeps other writers waiting)
MAX_BATCH = 64


@dataclass(slots=True)
class _Report:
    job_id: str
    attempt: int
    token: str
    body: bytes
    content_type: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


_STOP = object()


class ReportWriter:
    """The gateway's report ingest: `await ingest(...)` returns once the report is
    committed, or raises what `ingest_report` raised for it."""

    def __init__(
        self,
        ctx: GatewayContext,
        *,
        max_batch: int = MAX_BATCH,
        ingest: Callable[..., None] = ingest_report,
    ) -> None:
        self._ctx = ctx
        self._max_batch = max_batch
        self._ingest = ingest
        self._queue: queue.SimpleQueue[_Report | object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: reports queued and not yet answered (read and written on the event loop only)
        self._pending = 0
        #: transactions the writer thread committed (each holds one or more reports)
        self.committed_batches = 0

    async def ingest(
        self, job_id: str, attempt: int, token: str, body: bytes, content_type: str | None
    ) -> None:
        """Store one rank's report (see `ingest_report` for what it checks): at once on
        the calling loop when the store's writer is free and nothing is queued, else
        through the writer thread."""
        if not self._pending:
            try:
                with self._ctx.store.batch_now() as began:
                    if began:
                        self._ingest(
                            self._ctx, job_id, attempt, token, body, content_type, may_trim=False
                        )
                        return
            except TrimNeeded:  # deleting the job's oldest events is for the thread
                pass
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._ensure_thread()
        self._pending += 1
        try:
            self._queue.put(_Report(job_id, attempt, token, body, content_type, loop, future))
            await future
        finally:
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
        outcomes: list[BaseException | None] = []
        try:
            with self._ctx.store.batch():
                for report in batch:
                    try:
                        self._ingest(
                            self._ctx,
                            report.job_id,
                            report.attempt,
                            report.token,
                            report.body,
                            report.content_type,
                        )
                    except Exception as exc:  # this report's own answer; the rest go on
                        outcomes.append(exc)
                    else:
                        outcomes.append(None)
            self.committed_batches += 1
        except Exception as exc:  # the commit failed: nothing of the batch is stored
            outcomes = [exc] * len(batch)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Report, BaseException | None]]] = {}
        for report, outcome in zip(batch, outcomes, strict=True):
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
