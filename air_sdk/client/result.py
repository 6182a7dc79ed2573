"""The outcome of an `@air_sdk.distributed` call, read from a finished job's events.

Rank 0 posts the function's return value, and every rank that raised posts its
exception and traceback, as `result` events (`air_sdk.runtime.function_call`).
`function_result` turns them into what the caller gets: the value, unpickled
here, or a `JobFailedError` that carries the failing rank's traceback. Ranks that
raised the same error are named together ("ranks 0-3 raised ValueError: bad lr"),
the first rank the runner saw fail first.

Example:
    >>> job = Client().submit_script("train.py")  # doctest: +SKIP
    >>> function_result(job, job.wait())  # doctest: +SKIP
    Traceback (most recent call last):
    ...
    air_sdk.errors.AirError: job train-5d41402a recorded no return value: ...
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Sequence
from typing import Any

from air_sdk.client.job import Job, _failure_reason
from air_sdk.errors import AirError, JobFailedError
from air_sdk.schema.api import JobRecord
from air_sdk.schema.events import Event, EventType, FunctionResult
from air_sdk.schema.state import JobState

__all__ = ["function_result", "ranks_text"]

_Posted = tuple[Event, FunctionResult]


def function_result(job: Job, record: JobRecord) -> Any:
    """Rank 0's return value of the job's function, given the job's final `record`.

    Raises:
        JobFailedError: the job FAILED or was CANCELLED (with the remote traceback
            of the rank that raised, when one did).
        AirError: the job ran no `@air_sdk.distributed` function, or its value
            cannot be unpickled here.
    """
    posted = [(event, event.payload_as(FunctionResult)) for event in _result_events(job)]
    if record.state is not JobState.SUCCEEDED:
        raise failure_error(record, posted)
    values = [(e, r) for e, r in posted if r.ok and e.rank == 0 and r.value_b64 is not None]
    if not values:
        raise AirError(
            f"job {job.id} recorded no return value: only jobs of @air_sdk.distributed"
            " functions have one (see job.logs() for what it printed)"
        )
    _, newest = max(values, key=lambda pair: pair[0].seq)
    assert newest.value_b64 is not None
    try:
        return pickle.loads(base64.b64decode(newest.value_b64))
    except Exception as exc:
        raise AirError(
            f"rank 0's return value of job {job.id} cannot be unpickled here"
            f" ({type(exc).__name__}: {exc}): install what it needs where you call the"
            " function, or return plain data"
        ) from exc


def failure_error(record: JobRecord, posted: Sequence[_Posted]) -> JobFailedError:
    """The `JobFailedError` of a job that did not succeed, from its `result` events.

    Example:
        >>> failure_error(record, [])  # doctest: +SKIP
        JobFailedError('job j-1 failed: rank 1 exit code 3: worker crashed')
    """
    failure = record.failure
    if record.state is JobState.CANCELLED:
        return JobFailedError(record.id, f"it was cancelled ({record.state_reason or 'by a user'})")
    errors = [(e, r) for e, r in posted if not r.ok]
    if errors:
        attempt = failure.attempt if failure is not None else max(e.attempt or 0 for e, _ in errors)
        errors = [(e, r) for e, r in errors if (e.attempt or 0) == attempt] or errors
        return _raised(record, errors)
    reason = _failure_reason(record)
    tail = list(failure.log_tail) if failure is not None else []
    text = "\n".join(tail)
    has_traceback = "Traceback (most recent call last)" in text
    return JobFailedError(
        record.id,
        reason,
        remote_traceback=text if has_traceback else None,
        rank=failure.rank if failure is not None and has_traceback else None,
    )


def _raised(record: JobRecord, errors: Sequence[_Posted]) -> JobFailedError:
    groups: dict[tuple[str, str], list[_Posted]] = {}
    for event, result in sorted(errors, key=lambda pair: pair[0].seq):
        groups.setdefault((result.error_type or "Exception", result.error or ""), []).append(
            (event, result)
        )
    first_rank = record.failure.rank if record.failure is not None else None
    ordered = sorted(
        groups.values(),
        key=lambda group: (all(e.rank != first_rank for e, _ in group), group[0][0].seq),
    )
    parts = []
    for group in ordered:
        (error_type, message) = (group[0][1].error_type or "Exception", group[0][1].error or "")
        ranks = sorted({e.rank for e, _ in group if e.rank is not None})
        parts.append(
            f"{ranks_text(ranks)} raised {error_type}" + (f": {message}" if message else "")
        )
    event, primary = next(((e, r) for e, r in ordered[0] if e.rank == first_rank), ordered[0][0])
    return JobFailedError(
        record.id,
        "; ".join(parts),
        remote_traceback=primary.traceback,
        remote_type=primary.error_type,
        rank=event.rank,
    )


def ranks_text(ranks: Sequence[int]) -> str:
    """Ranks for people: "rank 3", "ranks 0-3", "ranks 0, 2-3" (runs as ranges).

    Example:
        >>> ranks_text([1]), ranks_text([0, 1, 2, 3]), ranks_text([0, 2, 3])
        ('rank 1', 'ranks 0-3', 'ranks 0, 2-3')
    """
    if not ranks:
        return "a rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    spans: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return "ranks " + ", ".join(spans)


def _result_events(job: Job) -> list[Event]:
    events: list[Event] = []
    after = 0
    while True:
        page = job.events(after=after, types=[EventType.RESULT])
        events += page.events
        if not page.events:
            return events
        after = page.last_seq
