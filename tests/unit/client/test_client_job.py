"""The Job handle: follow() across dropped streams, wait(), snapshot() and reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from air_sdk.client import Client, Job, _http
from air_sdk.client._http import mock_response, mock_session
from air_sdk.errors import JobFailedError, JobTimeoutError, NotFoundError, TransportError
from air_sdk.schema import Event, JobRecord, JobSpec, JobState
from air_sdk.schema.api import FailureInfo

URL = "http://gw.test"
JOB = "j-1"


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    asked: list[float] = []
    monkeypatch.setattr(_http, "_sleep", asked.append)
    return asked


def event(seq: int, type_: str = "metrics", **data: object) -> Event:
    if type_ == "metrics" and not data:
        data = {"points": [{"step": seq, "ts": float(seq), "values": {"loss": 1.0 / seq}}]}
    return Event(seq=seq, job_id=JOB, ts=float(seq), type=type_, rank=0, data=data)


def state(seq: int, value: JobState) -> Event:
    return event(seq, "state", state=value.value)


def sse(*events: Event, then: BaseException | None = None) -> list[bytes | BaseException]:
    chunks: list[bytes | BaseException] = [b": ping\n\n"]
    for e in events:
        chunks.append(f"id: {e.seq}\ndata: {e.model_dump_json()}\n\n".encode())
    if then is not None:
        chunks.append(then)
    return chunks


def record(value: JobState, **extra: object) -> JobRecord:
    return JobRecord(
        id=JOB,
        tenant="t",
        name="demo",
        state=value,
        spec=JobSpec(entrypoint="train.py"),
        created_at=0.0,
        updated_at=0.0,
        **extra,
    )


Handler = Callable[[requests.PreparedRequest], requests.Response]


def job_with(handler: Handler) -> tuple[Job, list[requests.PreparedRequest]]:
    seen: list[requests.PreparedRequest] = []

    def recording(request: requests.PreparedRequest) -> requests.Response:
        seen.append(request)
        return handler(request)

    client = Client(URL, token="tok", session=mock_session(recording), max_attempts=3)
    return Job(client, record(JobState.RUNNING)), seen


def query(request: requests.PreparedRequest) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(request.url).query).items()}


def test_follow_reconnects_from_last_seq_after_a_drop(waits: list[float]) -> None:
    streams = [
        sse(state(1, JobState.RUNNING), event(2), then=requests.exceptions.ChunkedEncodingError()),
        sse(event(2), event(3), state(4, JobState.SUCCEEDED), event(5)),
    ]

    def handler(request: requests.PreparedRequest) -> requests.Response:
        assert request.path_url.startswith(f"/v1/jobs/{JOB}/events/stream")
        return mock_response(200, chunks=streams.pop(0))

    job, seen = job_with(handler)
    assert [e.seq for e in job.follow()] == [1, 2, 3, 4]  # no repeat of 2, stops at the end
    assert query(seen[0])["after"] == "0"
    assert query(seen[1])["after"] == "2"
    assert seen[1].headers["Last-Event-ID"] == "2"
    assert seen[1].headers["Accept"] == "text/event-stream"
    assert len(waits) == 1  # one backoff before reconnecting


def test_follow_ends_on_terminal_state_without_reading_on(waits: list[float]) -> None:
    def handler(request: requests.PreparedRequest) -> requests.Response:
        return mock_response(
            200, chunks=sse(state(3, JobState.FAILED), then=AssertionError("read past the end"))
        )

    job, seen = job_with(handler)
    assert [e.type.value for e in job.follow(after=2)] == ["state"]
    assert len(seen) == 1


def test_follow_after_clean_close_catches_up_and_stops_when_terminal(waits: list[float]) -> None:
    def handler(request: requests.PreparedRequest) -> requests.Response:
        path, after = request.path_url.split("?")[0], int(query(request)["after"])
        if path.endswith("/events/stream"):
            return mock_response(200, chunks=sse(event(1)))  # closes cleanly, job still going
        # The catch-up page: the job ended in the meantime (its last event is a log line).
        events = [event(2), event(3, "log", lines=["bye"])] if after < 2 else []
        page = {"events": [json.loads(e.model_dump_json()) for e in events if e.seq > after]}
        return mock_response(200, {**page, "last_seq": 3, "state": "CANCELLED"})

    job, seen = job_with(handler)
    assert [e.seq for e in job.follow()] == [1, 2, 3]
    assert sum(r.path_url.split("?")[0].endswith("/stream") for r in seen) == 1


def test_follow_gives_up_after_repeated_drops(waits: list[float]) -> None:
    def handler(request: requests.PreparedRequest) -> requests.Response:
        return mock_response(200, chunks=sse(then=requests.ConnectionError("reset by peer")))

    job, _ = job_with(handler)
    with pytest.raises(TransportError, match="could not reach the gateway"):
        list(job.follow())


def test_follow_without_a_limit_keeps_reconnecting_and_says_so(waits: list[float]) -> None:
    drops = 8  # more than the client's max_attempts (3)

    def handler(request: requests.PreparedRequest) -> requests.Response:
        nonlocal drops
        if drops:
            drops -= 1
            raise requests.ConnectionError("[Errno 111] Connection refused")
        return mock_response(200, chunks=sse(state(1, JobState.SUCCEEDED)))

    heard: list[tuple[str, float]] = []
    job, _ = job_with(handler)
    events = list(job.follow(max_attempts=None, on_retry=lambda e, s: heard.append((str(e), s))))
    assert [e.seq for e in events] == [1]
    # a refused request gives up at once; follow waits for the gateway to come back
    assert [text.split(": ", 1)[1] for text, _ in heard] == [
        "Connection refused; start one with `air gateway start`"
    ] * 8
    assert all(0 <= w <= _http.BACKOFF_MAX_S for w in waits)


def test_the_wait_grows_over_a_run_of_drops_and_starts_over_after_an_event(
    waits: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_http.random, "uniform", lambda low, high: high)  # the cap itself
    streams = [
        sse(then=requests.exceptions.ChunkedEncodingError()),
        sse(then=requests.exceptions.ChunkedEncodingError()),
        sse(event(1), then=requests.exceptions.ChunkedEncodingError()),
        sse(state(2, JobState.SUCCEEDED)),
    ]
    job, _ = job_with(lambda request: mock_response(200, chunks=streams.pop(0)))
    assert [e.seq for e in job.follow()] == [1, 2]
    assert waits == [0.25, 0.5, 0.25]


def test_stopping_early_closes_the_stream(waits: list[float]) -> None:
    responses: list[requests.Response] = []

    def handler(request: requests.PreparedRequest) -> requests.Response:
        responses.append(mock_response(200, chunks=sse(event(1), event(2))))
        return responses[-1]

    job, _ = job_with(handler)
    stream = job.follow()
    assert next(stream).seq == 1
    stream.close()  # e.g. Ctrl-C in `air logs -f`: no reconnect, no wait
    assert responses[0].raw.closed and waits == [] and len(responses) == 1


def test_follow_skips_unknown_event_types(waits: list[float]) -> None:
    unknown = b'id: 2\ndata: {"seq": 2, "job_id": "j-1", "ts": 0, "type": "future"}\n\n'
    chunks = sse(event(1))
    chunks.insert(2, unknown)
    chunks.append(f"data: {state(3, JobState.SUCCEEDED).model_dump_json()}\n\n".encode())

    job, _ = job_with(lambda request: mock_response(200, chunks=chunks))
    assert [e.seq for e in job.follow()] == [1, 3]


def test_snapshot_folds_every_page(waits: list[float]) -> None:
    log = [state(1, JobState.RUNNING), *[event(s) for s in range(2, 6)]]
    log.append(state(6, JobState.SUCCEEDED))

    def handler(request: requests.PreparedRequest) -> requests.Response:
        after = int(query(request)["after"])
        page = [json.loads(e.model_dump_json()) for e in log if e.seq > after][:2]
        return mock_response(200, {"events": page, "last_seq": 6, "state": "SUCCEEDED"})

    job, seen = job_with(handler)
    snap = job.snapshot()
    assert snap.state is JobState.SUCCEEDED
    assert snap.step == 5 and snap.latest["loss"] == pytest.approx(0.2)
    assert len(seen) == 4  # three pages of two, then the empty one


def test_wait_polls_until_terminal(waits: list[float]) -> None:
    states = [JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED]
    job, _ = job_with(lambda request: mock_response(200, record(states.pop(0))))
    assert job.wait(poll_s=0.25).state is JobState.SUCCEEDED
    assert waits == [0.25, 0.25]
    assert repr(job) == "Job(id='j-1', state=SUCCEEDED)"


def test_wait_raises_on_failure_with_the_reason(waits: list[float]) -> None:
    failure = FailureInfo(attempt=1, reason="rank 1 crashed", rank=1, exit_code=3)
    job, _ = job_with(lambda request: mock_response(200, record(JobState.FAILED, failure=failure)))
    assert job.wait().state is JobState.FAILED  # no raise unless asked
    with pytest.raises(JobFailedError, match="rank 1 crashed; rank 1 exit code 3"):
        job.wait(raise_on_failure=True)


def test_wait_times_out(waits: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.0, 5.0, 5.0, 11.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    job, _ = job_with(lambda request: mock_response(200, record(JobState.RUNNING)))
    with pytest.raises(JobTimeoutError, match="still RUNNING after 10 s.*air cancel j-1"):
        job.wait(timeout=10, poll_s=5)


def test_reads_hit_their_routes(waits: list[float]) -> None:
    answers = {
        "/logs": {"lines": [{"attempt": 1, "rank": 0, "text": "hi"}], "last_seq": 4},
        "/metrics": {"points": [{"attempt": 1, "rank": 0, "step": 1, "ts": 1.0, "values": {}}]},
        "/attempts": {"attempts": []},
    }

    def handler(request: requests.PreparedRequest) -> requests.Response:
        path = request.path_url.split("?")[0]
        if request.method == "POST":
            assert path == f"/v1/jobs/{JOB}/cancel"
            return mock_response(200, record(JobState.CANCELLED, cancel_requested=True))
        answer = answers.get(path.removeprefix(f"/v1/jobs/{JOB}"))
        return mock_response(200, answer) if answer else mock_response(404, {"detail": "no"})

    job, seen = job_with(handler)
    assert [line.text for line in job.logs(rank=0, tail=5)] == ["hi"]
    assert query(seen[-1]) == {"rank": "0", "tail": "5"}
    assert job.metrics(name="loss")[0].step == 1
    assert query(seen[-1]) == {"name": "loss"}
    assert job.attempts() == []
    assert job.cancel().cancel_requested
    with pytest.raises(NotFoundError):
        Job(job.client, "j-1/missing").record()  # the id is one path segment, escaped
    assert seen[-1].path_url == "/v1/jobs/j-1%2Fmissing"
