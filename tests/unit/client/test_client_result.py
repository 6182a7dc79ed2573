"""`Job.result()`: rank 0's value of an `@air_sdk.distributed` job, or the error a rank
raised, read from the job's `result` events (a mock transport plays the gateway)."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import cloudpickle
import pytest
import requests

from air_sdk.client import Client, Job
from air_sdk.client._http import mock_response, mock_session
from air_sdk.errors import AirError, JobFailedError
from air_sdk.schema import Event, FunctionResult, JobRecord, JobSpec, JobState
from air_sdk.schema.api import FailureInfo

URL = "http://gw.test"
JOB = "j-1"


def record(state: JobState, **extra: Any) -> JobRecord:
    return JobRecord(
        id=JOB,
        tenant="t",
        name="train",
        state=state,
        spec=JobSpec(code="pass"),
        created_at=0.0,
        updated_at=0.0,
        **extra,
    )


def returned(seq: int, value: Any, *, attempt: int = 1, rank: int = 0) -> Event:
    data = cloudpickle.dumps(value)
    result = FunctionResult(
        ok=True, value_b64=base64.b64encode(data).decode(), size_bytes=len(data)
    )
    return Event(
        seq=seq,
        job_id=JOB,
        ts=float(seq),
        type="result",
        attempt=attempt,
        rank=rank,
        data=result.model_dump(),
    )


def raised(seq: int, rank: int, error_type: str, error: str, *, attempt: int = 1) -> Event:
    result = FunctionResult(
        ok=False,
        error_type=error_type,
        error=error,
        traceback=f"Traceback (most recent call last):\n  rank {rank} frame\n{error_type}: {error}\n",
    )
    return Event(
        seq=seq,
        job_id=JOB,
        ts=float(seq),
        type="result",
        attempt=attempt,
        rank=rank,
        data=result.model_dump(),
    )


def job_serving(final: JobRecord, events: list[Event]) -> tuple[Job, list[dict[str, list[str]]]]:
    """A Job whose gateway answers with `final` and, filtered by type, `events`."""
    queries: list[dict[str, list[str]]] = []

    def handler(request: requests.PreparedRequest) -> requests.Response:
        path = urlsplit(request.url).path
        query = parse_qs(urlsplit(request.url).query)
        if path == f"/v1/jobs/{JOB}":
            return mock_response(200, final)
        assert path == f"/v1/jobs/{JOB}/events", path
        queries.append(query)
        after = int(query["after"][0])
        page = [e for e in events if e.seq > after and e.type.value in query["type"]]
        body = {
            "events": [json.loads(e.model_dump_json()) for e in page],
            "last_seq": page[-1].seq if page else after,
            "state": final.state.value,
        }
        return mock_response(200, body)

    client = Client(URL, token="tok", session=mock_session(handler), max_attempts=1)
    return Job(client, JOB), queries


class Summary:
    def __init__(self, loss: float) -> None:
        self.loss = loss


def test_the_value_rank_0_returned_in_the_last_attempt_comes_back():
    events = [returned(3, {"loss": 0.9}, attempt=1), returned(9, Summary(0.25), attempt=2)]
    events.append(returned(10, "rank 1 is ignored", attempt=2, rank=1))
    job, queries = job_serving(record(JobState.SUCCEEDED, attempt=2), events)

    value = job.result(timeout=5)

    assert isinstance(value, Summary) and value.loss == 0.25  # the caller's own class
    assert queries[0]["type"] == ["result"]  # only result events are read, not the log


def test_ranks_that_raised_the_same_error_are_named_together_first_failer_first():
    failure = FailureInfo(attempt=1, reason="rank 1 exit code 1", rank=1, exit_code=1)
    events = [
        returned(2, "rank 0 finished first"),
        raised(4, 2, "RuntimeError", "peer gone"),
        raised(5, 0, "ValueError", "bad lr"),
        raised(6, 1, "ValueError", "bad lr"),
    ]
    job, _ = job_serving(record(JobState.FAILED, attempt=1, failure=failure), events)

    with pytest.raises(JobFailedError) as info:
        job.result()

    error = info.value
    assert (
        error.reason == "ranks 0-1 raised ValueError: bad lr; rank 2 raised RuntimeError: peer gone"
    )
    assert (error.rank, error.remote_type) == (1, "ValueError")  # the runner's first failure
    assert "rank 1 frame" in (error.remote_traceback or "")
    assert str(error).endswith(
        "Remote traceback (rank 1):\n" + (error.remote_traceback or "").rstrip()
    )
    lines = error._render_traceback_()
    assert lines[0] == "Remote traceback on rank 1:"
    assert lines[-1] == f"JobFailedError: job {JOB} failed: {error.reason}"


def test_only_the_failing_attempt_counts():
    failure = FailureInfo(attempt=2, reason="rank 0 exit code 1", rank=0, exit_code=1)
    events = [raised(3, 0, "ValueError", "first try"), raised(8, 0, "KeyError", "'x'", attempt=2)]
    job, _ = job_serving(record(JobState.FAILED, attempt=2, failure=failure), events)
    with pytest.raises(JobFailedError) as info:
        job.result()
    assert info.value.reason == "rank 0 raised KeyError: 'x'"
    assert "first try" not in str(info.value)


def test_a_rank_that_died_without_raising_shows_the_failure_and_its_traceback_tail():
    tail = ["Traceback (most recent call last):", '  File "<air call>", line 1', "ImportError: x"]
    failure = FailureInfo(
        attempt=1, reason="worker crashed", rank=1, exit_code=1, log_tail=["setup", *tail]
    )
    job, _ = job_serving(record(JobState.FAILED, attempt=1, failure=failure), [])
    with pytest.raises(JobFailedError) as info:
        job.result()
    assert info.value.reason == "worker crashed; rank 1 exit code 1"
    assert info.value.remote_traceback == "\n".join(["setup", *tail])


def test_a_killed_rank_without_a_traceback_has_none():
    failure = FailureInfo(attempt=1, reason="out of memory", kind="oom", rank=0, signal="SIGKILL")
    job, _ = job_serving(record(JobState.FAILED, attempt=1, failure=failure), [])
    with pytest.raises(JobFailedError) as info:
        job.result()
    assert info.value.remote_traceback is None
    assert info.value._render_traceback_() == [
        f"JobFailedError: job {JOB} failed: out of memory; rank 0 signal SIGKILL"
    ]


def test_a_cancelled_job_raises_saying_so():
    final = record(JobState.CANCELLED, state_reason="cancelled by alice")
    job, _ = job_serving(final, [returned(2, 1)])
    with pytest.raises(JobFailedError, match="it was cancelled \\(cancelled by alice\\)"):
        job.result()


def test_a_job_without_a_function_has_no_value():
    job, _ = job_serving(record(JobState.SUCCEEDED), [])
    with pytest.raises(
        AirError, match="recorded no return value: only jobs of @air_sdk.distributed"
    ):
        job.result()


def test_a_value_this_process_cannot_unpickle_says_what_to_install():
    # A pickle of a class from a module only the workers have.
    data = b"cmissing_mod\nCls\n."
    event = returned(2, None)
    event = event.model_copy(
        update={"data": {**event.data, "value_b64": base64.b64encode(data).decode()}}
    )
    job, _ = job_serving(record(JobState.SUCCEEDED), [event])
    with pytest.raises(AirError, match="cannot be unpickled here \\(ModuleNotFoundError"):
        job.result()
