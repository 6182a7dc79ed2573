"""`Job`: a handle on one submitted job. Reads state, events, logs and metrics.

Every read goes to the gateway (nothing here talks to workers): the event log is
the single source of truth, and `follow()` resumes from the last sequence number
it saw after a dropped connection.

Examples marked `+SKIP` need a running gateway and a job on it.

Example:
    >>> job = Client().job("train-5d41402a")  # doctest: +SKIP
    >>> for event in job.follow():  # doctest: +SKIP
    ...     print(event.seq, event.type.value)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import requests
from pydantic import ValidationError

from air_sdk.client import _http
from air_sdk.client.sse import iter_sse
from air_sdk.errors import JobFailedError, JobTimeoutError, TransportError
from air_sdk.schema.api import (
    AttemptList,
    AttemptRecord,
    CheckpointList,
    EventPage,
    JobRecord,
    LogLine,
    LogPage,
    MetricRow,
    MetricsPage,
)
from air_sdk.schema.events import Event, EventType, StateChange
from air_sdk.schema.outputs import OutputList
from air_sdk.schema.snapshot import JobSnapshot
from air_sdk.schema.state import JobState

if TYPE_CHECKING:
    from air_sdk.client.client import Client
    from air_sdk.notebook.monitor import JobMonitor

__all__ = ["Job", "is_terminal_event"]

log = logging.getLogger(__name__)

#: the gateway sends a keep-alive comment every 15 s; three missed ones mean a dead stream
STREAM_READ_TIMEOUT_S = 60.0
EVENT_PAGE_LIMIT = 1000


class _Default:
    """The type of `_CLIENT_DEFAULT`: "use the client's setting"."""


_CLIENT_DEFAULT = _Default()


class _StreamEnded(Exception):
    """The server closed the event stream before the job ended (not a failure)."""


@dataclass
class _Cursor:
    """The last sequence number a follower yielded."""

    seq: int


def is_terminal_event(event: Event) -> bool:
    """True for the `state` event that ends a job.

    Example:
        >>> is_terminal_event(Event(seq=9, job_id="j", ts=0, type="state", data={"state": "FAILED"}))
        True
    """
    if event.type is not EventType.STATE:
        return False
    try:
        return event.payload_as(StateChange).state.terminal
    except ValueError:  # a state this client does not know (a newer gateway)
        return False


class Job:
    """A submitted job.

    Example:
        >>> job = Client().submit_script("train.py", nodes=2)  # doctest: +SKIP
        >>> job.wait(timeout=600, raise_on_failure=True).state  # doctest: +SKIP
        <JobState.SUCCEEDED: 'SUCCEEDED'>
    """

    def __init__(self, client: Client, record: JobRecord | str) -> None:
        self.client = client
        if isinstance(record, JobRecord):
            self.id = record.id
            self._record: JobRecord | None = record
        else:
            self.id = record
            self._record = None

    def __repr__(self) -> str:
        # No request here: a repr must never block or fail.
        state = self._record.state.value if self._record else "?"
        return f"Job(id={self.id!r}, state={state})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def _path(self) -> str:
        return f"/v1/jobs/{quote(self.id, safe='')}"

    # -- state ---------------------------------------------------------------

    def record(self) -> JobRecord:
        """The gateway's current record of this job.

        Example:
            >>> job.record().attempt  # doctest: +SKIP
            1
        """
        self._record = self.client.job_record(self.id)
        return self._record

    def status(self) -> JobState:
        """The job's current state.

        Example:
            >>> job.status()  # doctest: +SKIP
            <JobState.RUNNING: 'RUNNING'>
        """
        return self.record().state

    def wait(
        self, timeout: float | None = None, *, raise_on_failure: bool = False, poll_s: float = 0.5
    ) -> JobRecord:
        """Block until the job ends; return its final record.

        Raises `JobTimeoutError` when `timeout` seconds pass first, and
        `JobFailedError` for a FAILED job when `raise_on_failure` is set.

        Example:
            >>> job.wait(timeout=300).state  # doctest: +SKIP
            <JobState.SUCCEEDED: 'SUCCEEDED'>
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            record = self.record()
            if record.state.terminal:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeoutError(
                    f"job {self.id} is still {record.state.value} after {timeout:g} s;"
                    f" wait longer, or cancel it with `air cancel {self.id}`"
                )
            pause = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
            _http._sleep(max(pause, 0.0))
        if raise_on_failure and record.state is JobState.FAILED:
            raise JobFailedError(self.id, _failure_reason(record))
        return record

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's return value of the `@air_sdk.distributed` function this job runs,
        once the job ends (waiting up to `timeout` seconds).

        Raises `JobFailedError` for a FAILED or CANCELLED job, with the traceback of
        the rank that raised (IPython shows that traceback), and `JobTimeoutError`
        when `timeout` runs out first.

        Example:
            >>> job = train.submit(epochs=3)  # doctest: +SKIP
            >>> job.result(timeout=600)  # doctest: +SKIP
            {'loss': 0.0123}
        """
        from air_sdk.client.result import function_result

        return function_result(self, self.wait(timeout))

    def cancel(self) -> JobRecord:
        """Ask the gateway to cancel the job (idempotent; a finished job stays as it ended).

        Example:
            >>> job.cancel().cancel_requested  # doctest: +SKIP
            True
        """
        self._record = self.client._post(f"{self._path}/cancel", JobRecord)
        return self._record

    def attempts(self) -> list[AttemptRecord]:
        """Every (re)launch so far, oldest first, with placement and failure.

        Example:
            >>> [a.attempt for a in job.attempts()]  # doctest: +SKIP
            [1, 2]
        """
        return self.client._get(f"{self._path}/attempts", AttemptList).attempts

    # -- events --------------------------------------------------------------

    def events(
        self,
        after: int = 0,
        limit: int = EVENT_PAGE_LIMIT,
        types: Sequence[EventType] | None = None,
    ) -> EventPage:
        """One page of the event log: events with `seq > after`, at most `limit`, only
        of `types` when given.

        Example:
            >>> page = job.events(after=0)  # doctest: +SKIP
            >>> next_page = job.events(after=page.last_seq)  # doctest: +SKIP
            >>> job.events(types=[EventType.CHECKPOINT]).events  # doctest: +SKIP
        """
        params: dict[str, Any] = {"after": after, "limit": limit}
        if types:
            params["type"] = [EventType(t).value for t in types]
        return self.client._get(f"{self._path}/events", EventPage, params)

    def new_snapshot(self) -> JobSnapshot:
        """An empty snapshot to fold this job's events into, knowing what the events do
        not say: the run's length from the spec (`total_steps`, for a reader that
        attaches to a job submitted elsewhere). Folding a rank's logged total replaces it.

        Example:
            >>> job.new_snapshot().total_steps  # doctest: +SKIP
            150
        """
        record = self._record if self._record is not None else self.record()
        return JobSnapshot(job_id=self.id, total_steps=record.spec.total_steps)

    def snapshot(self) -> JobSnapshot:
        """The fold of the whole event log: state, step, latest metrics, log tails.

        Example:
            >>> job.snapshot().latest.get("loss")  # doctest: +SKIP
            0.0123
        """
        snap = self.new_snapshot()
        while True:
            before = snap.last_seq
            for event in self.events(after=before).events:
                snap.apply(event)
            if snap.last_seq <= before:  # an empty page: the end of the log
                break
        return snap

    def follow(
        self,
        after: int = 0,
        *,
        max_attempts: int | None | _Default = _CLIENT_DEFAULT,
        on_retry: Callable[[BaseException, float], None] | None = None,
    ) -> Iterator[Event]:
        """Stream events with `seq > after` live, until the job ends.

        Reconnects after a dropped connection from the last sequence number it
        yielded (so no event is lost or repeated), by the client's one retry policy
        (`air_sdk.client._http.retrying`: jittered backoff, counted afresh after
        every event), also when the gateway refuses connections for a while (a
        restart); gives up with `TransportError` after `max_attempts` failures in a
        row (default: the client's; None: never). A stream the server closes before
        the job ended is read on by pages and opened again, without giving up.
        `on_retry(error, wait_s)` hears of each reconnect.

        Example:
            >>> snap = JobSnapshot(job_id=job.id)  # doctest: +SKIP
            >>> for event in job.follow():  # doctest: +SKIP
            ...     snap.apply(event)
        """
        http = self.client._http
        limit = http.max_attempts if isinstance(max_attempts, _Default) else max_attempts
        cursor = _Cursor(after)
        run = _http.FailureRun()  # reset by every event read, so each drop starts afresh
        # A gateway that refuses connections after it answered is restarting: wait for it
        # like for a dropped stream (a lone request refused says so at once instead).
        policy = _http.retrying(
            limit,
            retry_on=(_StreamEnded, *_http.DROPPED, TransportError),
            counted=(*_http.DROPPED, TransportError),
            on_retry=on_retry,
            run=run,
        )
        try:
            for attempt in policy:
                with attempt:
                    if (yield from self._read_on(cursor, run)):
                        return
                    raise _StreamEnded  # read to the end, job still going: open it again
        except requests.RequestException as exc:
            raise http.transport_error(exc) from exc

    def _read_on(self, cursor: _Cursor, run: _http.FailureRun) -> Generator[Event, None, bool]:
        """Yield what the event stream brings after `cursor`, then catch up by pages once
        the server closes it; returns True when the job has ended."""
        http = self.client._http
        response = http.request(
            "GET",
            f"{self._path}/events/stream",
            params={"after": cursor.seq},
            headers={"Accept": "text/event-stream", "Last-Event-ID": str(cursor.seq)},
            stream=True,
            timeout=(http.timeout_s, max(http.timeout_s, STREAM_READ_TIMEOUT_S)),
        )
        try:
            for message in iter_sse(response.iter_content(chunk_size=None)):
                event = _parse_event(message.data)
                if event is None or event.seq <= cursor.seq:
                    continue
                cursor.seq = event.seq
                run.reset()
                yield event
                if is_terminal_event(event):
                    return True
        finally:
            response.close()
        while True:  # the server closed the stream: catch up by pages
            before = cursor.seq
            page = self.events(after=cursor.seq)
            for event in page.events:
                if event.seq <= cursor.seq:
                    continue
                cursor.seq = event.seq
                run.reset()
                yield event
                if is_terminal_event(event):
                    return True
            if cursor.seq <= before:  # an empty page: caught up
                return page.state.terminal

    def monitor(self, **options: Any) -> JobMonitor:
        """A live notebook widget for this job (needs the `notebook` extra).

        Options go to `air_sdk.notebook.JobMonitor`: `total_steps`,
        `max_updates_per_s`, `start`. Tokens/s and MFU appear by themselves when the
        script logs `tokens=` (`air.log(step=..., loss=..., tokens=N)`).

        Example:
            >>> job.monitor(total_steps=1000)  # doctest: +SKIP
        """
        # Imported here: the client must not load ipywidgets or matplotlib on import.
        from air_sdk.notebook.monitor import JobMonitor

        return JobMonitor(self, **options)

    # -- logs and metrics ----------------------------------------------------

    def log_page(
        self,
        rank: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int | None = None,
    ) -> LogPage:
        """One page of log lines and the event `last_seq` it ends at (to follow on from
        there). The gateway bounds a page (about 10,000 lines or 4 MiB of text):
        `page.more` says there is more; `logs()` and `log_pages()` page for you.

        Example:
            >>> page = job.log_page(tail=20)  # doctest: +SKIP
            >>> later = [e for e in job.follow(after=page.last_seq)]  # doctest: +SKIP
        """
        params = {
            "rank": rank,
            "attempt": attempt,
            "tail": tail,
            "after": after or None,
            "before": before,
            "limit": limit,
        }
        return self.client._get(f"{self._path}/logs", LogPage, params)

    def log_pages(
        self, rank: int | None = None, attempt: int | None = None, tail: int | None = None
    ) -> Iterator[LogPage]:
        """Every page of the job's log lines, oldest first, so a caller can print them
        as they come; with `tail`, the pages of the newest `tail` lines (fetched newest
        first, yielded oldest first).

        Example:
            >>> for page in job.log_pages():  # doctest: +SKIP
            ...     for line in page.lines:
            ...         print(line.text)
        """
        if tail is None:
            page = self.log_page(rank, attempt)
            yield page
            while page.more:
                page = self.log_page(rank, attempt, after=page.last_seq)
                yield page
            return
        pages = [self.log_page(rank, attempt, tail)]
        wanted = tail - len(pages[0].lines)
        while pages[-1].more and wanted > 0:
            older = self.log_page(rank, attempt, wanted, before=pages[-1].first_seq)
            if not older.lines:
                break
            pages.append(older)
            wanted -= len(older.lines)
        yield from reversed(pages)

    def logs(
        self, rank: int | None = None, attempt: int | None = None, tail: int | None = None
    ) -> list[LogLine]:
        """Log lines of every rank (or one `rank`), all attempts unless `attempt` is given;
        every line (page by page), or the newest `tail`.

        Example:
            >>> for line in job.logs(rank=0, tail=5):  # doctest: +SKIP
            ...     print(line.text)
        """
        return [line for page in self.log_pages(rank, attempt, tail) for line in page.lines]

    def metrics(self, name: str | None = None, rank: int | None = None) -> list[MetricRow]:
        """Logged metric rows (one per `air.log` call), optionally one name or rank.

        Example:
            >>> [(row.step, row.values["loss"]) for row in job.metrics("loss")][-1]  # doctest: +SKIP
            (199, 0.0123)
        """
        rows: list[MetricRow] = []
        after = 0
        while True:  # the gateway answers a bounded page at a time
            params = {"name": name, "rank": rank, "after": after or None}
            page = self.client._get(f"{self._path}/metrics", MetricsPage, params)
            rows.extend(page.points)
            if not page.more:
                return rows
            after = page.last_seq

    def checkpoints(self) -> CheckpointList:
        """Committed checkpoints (oldest first), ones restore passed over, and the step
        each attempt resumed from.

        Example:
            >>> [c.step for c in job.checkpoints().commits]  # doctest: +SKIP
            [10, 20, 30]
        """
        return self.client._get(f"{self._path}/checkpoints", CheckpointList, None)

    def outputs(self) -> OutputList:
        """The files in the job's output directory (`AIR_OUTPUT_DIR`): path, bytes, mtime.

        Example:
            >>> [(f.path, f.bytes) for f in job.outputs().files]  # doctest: +SKIP
            [('model/config.json', 512), ('model/model.safetensors', 497774208)]
        """
        return self.client._get(f"{self._path}/outputs", OutputList, None)

    def download_outputs(self, dest: str | os.PathLike[str] | None = None) -> list[Path]:
        """Download the job's output directory into `dest` (default `./<job id>`), each
        file under its relative path; the paths written.

        Example:
            >>> job.download_outputs("runs/7")  # doctest: +SKIP
            [PosixPath('runs/7/model/config.json'), PosixPath('runs/7/model/model.safetensors')]
        """
        from air_sdk.client.outputs import download

        target = Path(dest) if dest is not None else Path(self.id)
        return download(self.client, self._path, self.outputs(), target)


def _parse_event(data: str) -> Event | None:
    if not data.lstrip().startswith("{"):
        return None
    try:
        return Event.model_validate_json(data)
    except ValidationError as exc:
        # A newer gateway may send event types this client does not know.
        log.debug("skipping an event this client cannot read: %s", exc)
        return None


def _failure_reason(record: JobRecord) -> str:
    failure = record.failure
    if failure is None:
        return record.state_reason or "no reason recorded"
    parts = [failure.reason or record.state_reason or "failed"]
    if failure.rank is not None:
        how = f"signal {failure.signal}" if failure.signal else f"exit code {failure.exit_code}"
        if not parts[0].startswith(f"rank {failure.rank} {how}"):  # say it once
            parts.append(f"rank {failure.rank} {how}")
    return "; ".join(parts)
