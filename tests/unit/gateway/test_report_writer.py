"""The gateway's report ingest (`ReportWriter`): checked and parsed on the event loop,
the reports that arrive together committed in one transaction on the loop when the
store's writer is free, else queued and committed in groups by its thread; every report
is answered once it is committed, or with its own error."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from gatewaytest import make_app

from air_sdk.errors import ApiError, AuthError, ConflictError
from air_sdk.gateway.app import GatewayContext
from air_sdk.gateway.services.report_writer import ReportWriter
from air_sdk.gateway.services.reports import store_report
from air_sdk.runner import LocalBackend, Runner
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import JobSpec, JobState, NodeAssignment, Placement
from air_sdk.schema.columns import to_columns
from air_sdk.store import SqliteStore
from air_sdk.store.quota import MIB, JobQuotas

MSGPACK = "application/msgpack"


class Job:
    def __init__(self, home: Path, quotas: JobQuotas | None = None) -> None:
        if quotas is None:
            app, self.store = make_app(home)
            self.ctx: GatewayContext = app.state.air
        else:
            self.store = SqliteStore(home / "air.db", quotas=quotas)
            runner = Runner(self.store, LocalBackend(nodes=[NodeSpec("node-0", 1)]), home, "")
            self.ctx = GatewayContext(store=self.store, runner=runner, home=home)
        job, _ = self.store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
        self.store.transition(job.id, JobState.SCHEDULED, "placed")
        placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="node-0", slots=1),))
        self.id = job.id
        self.attempt, self.token = self.store.start_attempt(job.id, placement)
        #: the thread each report was ingested on, in order
        self.threads: list[str] = []

    def writer(self, **kw: Any) -> ReportWriter:
        def recorded(*args: Any, **kw: Any) -> None:
            self.threads.append(threading.current_thread().name)
            store_report(*args, **kw)

        return ReportWriter(self.ctx, store=recorded, **kw)

    def steps(self) -> list[int]:
        events = self.store.read_events(self.id, limit=10_000)
        return sorted(
            p["step"] for e in events if e.type.value == "metrics" for p in e.data["points"]
        )


def _body(step: int, num_points: int = 1) -> bytes:
    points = [(step * num_points + i, 1.0, {"loss": 0.5}) for i in range(num_points)]
    return msgpack.packb({"rank": 0, "columns": to_columns(points)})


def test_a_report_is_ingested_on_the_loop_when_the_store_is_free(tmp_path: Path) -> None:
    job = Job(tmp_path)
    writer = job.writer()

    async def post() -> None:
        await writer.ingest(job.id, job.attempt, job.token, _body(1), MSGPACK)

    asyncio.run(post())
    assert job.steps() == [1]
    assert job.threads == [threading.current_thread().name]  # no hand-off to a thread


def test_reports_that_arrive_together_are_committed_together_on_the_loop(tmp_path: Path) -> None:
    job = Job(tmp_path)
    writer = job.writer()

    async def post_all() -> list[Any]:
        posts = [writer.ingest(job.id, job.attempt, job.token, _body(s), MSGPACK) for s in range(6)]
        return await asyncio.wait_for(asyncio.gather(*posts, return_exceptions=True), 10)

    assert asyncio.run(post_all()) == [None] * 6
    assert job.steps() == [0, 1, 2, 3, 4, 5]
    assert job.threads == [threading.current_thread().name] * 6  # no hand-off to a thread
    assert (writer.loop_commits, writer.loop_reports) == (1, 6)  # one transaction for all


@pytest.mark.parametrize("gather_turns, commits", [(0, 2), (1, 1)])
def test_a_report_that_comes_a_turn_after_the_first_joins_its_group(
    tmp_path: Path, gather_turns: int, commits: int
) -> None:
    # A second rank's request read by the loop's next poll: with a turn of waiting, one
    # commit for both; without, one each
    job = Job(tmp_path)
    writer = job.writer(gather_turns=gather_turns)

    async def late() -> None:
        await asyncio.sleep(0)  # a turn later, as a request the next poll reads
        await writer.ingest(job.id, job.attempt, job.token, _body(2), MSGPACK)

    async def post_both() -> list[Any]:
        first = writer.ingest(job.id, job.attempt, job.token, _body(1), MSGPACK)
        both = asyncio.gather(first, late(), return_exceptions=True)
        return await asyncio.wait_for(both, 10)

    assert asyncio.run(post_both()) == [None, None]
    assert job.steps() == [1, 2]
    assert (writer.loop_commits, writer.loop_reports) == (commits, 2)


def test_reports_from_two_event_loops_at_once_are_each_committed_on_their_own_loop(
    tmp_path: Path,
) -> None:
    # A gateway has one loop; tests' clients (and anything else) may run one each.
    job = Job(tmp_path)
    writer = job.writer()
    results: dict[int, list[Any]] = {}

    def client(first: int) -> None:
        async def post_all() -> list[Any]:
            posts = [
                writer.ingest(job.id, job.attempt, job.token, _body(s), MSGPACK)
                for s in range(first, first + 3)
            ]
            return await asyncio.wait_for(asyncio.gather(*posts, return_exceptions=True), 10)

        results[first] = asyncio.run(post_all())

    threads = [threading.Thread(target=client, args=(first,)) for first in (0, 10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    writer.stop()
    assert results == {0: [None] * 3, 10: [None] * 3}
    assert job.steps() == [0, 1, 2, 10, 11, 12]


def test_a_report_whose_attempt_ends_before_its_commit_is_fenced_and_the_rest_are_stored(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    writer = job.writer()
    placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="node-0", slots=1),))

    async def post() -> list[Any]:
        old = asyncio.ensure_future(
            writer.ingest(job.id, job.attempt, job.token, _body(1), MSGPACK)
        )
        await asyncio.sleep(0)  # checked and parsed; its commit waits for this turn to end
        assert not old.done()
        attempt, token = job.store.start_attempt(job.id, placement)  # the runner restarts it
        new = writer.ingest(job.id, attempt, token, _body(2), MSGPACK)
        return await asyncio.wait_for(asyncio.gather(old, new, return_exceptions=True), 10)

    fenced, stored = asyncio.run(post())
    assert isinstance(fenced, ConflictError) and fenced.status == 409
    assert "no longer current" in str(fenced)
    assert stored is None
    assert job.steps() == [2]


def test_a_group_whose_transaction_cannot_begin_gets_the_error_and_nothing_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = Job(tmp_path)
    writer = job.writer()

    @contextlib.contextmanager
    def broken() -> Iterator[bool]:
        raise sqlite3.OperationalError("disk I/O error")
        yield True

    monkeypatch.setattr(job.store, "batch_now", broken)

    async def post_all() -> list[Any]:
        posts = [writer.ingest(job.id, job.attempt, job.token, _body(s), MSGPACK) for s in range(3)]
        return await asyncio.wait_for(asyncio.gather(*posts, return_exceptions=True), 10)

    results = asyncio.run(post_all())
    assert [type(r) for r in results] == [sqlite3.OperationalError] * 3
    monkeypatch.undo()
    assert job.steps() == []


def test_reports_wait_for_a_busy_store_and_commit_together(tmp_path: Path) -> None:
    job = Job(tmp_path)
    writer = job.writer()
    holding, release = threading.Event(), threading.Event()

    def busy_writer() -> None:  # the runner in a long transaction
        with job.store.batch():
            holding.set()
            release.wait(10)

    async def post_all() -> list[Any]:
        posts = [
            asyncio.ensure_future(writer.ingest(job.id, job.attempt, job.token, _body(s), MSGPACK))
            for s in range(5)
        ]
        await asyncio.sleep(0.3)
        assert not any(p.done() for p in posts)  # none answered before it is stored
        assert job.steps() == []
        release.set()
        return await asyncio.wait_for(asyncio.gather(*posts, return_exceptions=True), 10)

    thread = threading.Thread(target=busy_writer)
    thread.start()
    assert holding.wait(10)
    try:
        results = asyncio.run(post_all())
    finally:
        release.set()
        thread.join(10)
        writer.stop()
    assert results == [None] * 5
    assert job.steps() == [0, 1, 2, 3, 4]
    assert set(job.threads) == {"air-report-writer"}
    assert writer.committed_batches < 5  # queued while the store was busy: fewer commits


def test_a_refused_report_in_a_group_gets_its_own_error_and_the_rest_are_stored(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    writer = job.writer()
    holding, release = threading.Event(), threading.Event()

    def busy_writer() -> None:
        with job.store.batch():
            holding.set()
            release.wait(10)

    async def post_all() -> list[Any]:
        posts = [
            writer.ingest(job.id, job.attempt, job.token, _body(1), MSGPACK),
            writer.ingest(job.id, job.attempt, "airw_not-the-token", _body(2), MSGPACK),
            writer.ingest(job.id, job.attempt, job.token, b"\xc1", MSGPACK),  # not msgpack
            writer.ingest(job.id, job.attempt, job.token, _body(3), MSGPACK),
        ]
        gathered = asyncio.gather(*posts, return_exceptions=True)
        await asyncio.sleep(0.2)
        release.set()
        return await asyncio.wait_for(gathered, 10)

    thread = threading.Thread(target=busy_writer)
    thread.start()
    assert holding.wait(10)
    try:
        ok1, bad_token, bad_body, ok3 = asyncio.run(post_all())
    finally:
        release.set()
        thread.join(10)
        writer.stop()
    assert ok1 is None and ok3 is None
    assert isinstance(bad_token, AuthError) and bad_token.status == 401
    assert isinstance(bad_body, ApiError) and bad_body.status == 422
    assert job.steps() == [1, 3]


def test_a_stopped_writer_ingests_what_was_queued_and_a_later_report_starts_it_again(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    writer = job.writer()
    holding, release = threading.Event(), threading.Event()

    def busy_writer() -> None:
        with job.store.batch():
            holding.set()
            release.wait(10)

    async def queued_then_stopped() -> None:
        post = asyncio.ensure_future(
            writer.ingest(job.id, job.attempt, job.token, _body(1), MSGPACK)
        )
        await asyncio.sleep(0.1)
        release.set()
        await asyncio.get_running_loop().run_in_executor(None, writer.stop)
        await asyncio.wait_for(post, 10)
        await writer.ingest(job.id, job.attempt, job.token, _body(2), MSGPACK)

    thread = threading.Thread(target=busy_writer)
    thread.start()
    assert holding.wait(10)
    try:
        asyncio.run(queued_then_stopped())
    finally:
        release.set()
        thread.join(10)
    assert job.steps() == [1, 2]


@pytest.mark.parametrize("token_ok", [True, False])
def test_the_loop_path_answers_the_same_as_the_queued_one(tmp_path: Path, token_ok: bool) -> None:
    job = Job(tmp_path)
    writer = job.writer()
    token = job.token if token_ok else "airw_wrong"

    async def post() -> None:
        await writer.ingest(job.id, job.attempt, token, _body(7), MSGPACK)

    if token_ok:
        asyncio.run(post())
        assert job.steps() == [7]
    else:
        with pytest.raises(AuthError):
            asyncio.run(post())
        assert job.steps() == []


def test_a_report_that_needs_a_quota_trim_is_handed_to_the_thread(tmp_path: Path) -> None:
    # Trimming deletes megabytes of old events: never on the event loop.
    job = Job(tmp_path, JobQuotas(max_metric_bytes=MIB))
    writer = job.writer()

    async def post_until_trimmed() -> int:
        for step in range(200):  # ~20 KB stored a report: past 1 MiB within ~55
            await writer.ingest(job.id, job.attempt, job.token, _body(step, 1000), MSGPACK)
            if "air-report-writer" in job.threads:
                return step
        raise AssertionError("no report was handed to the writer thread")

    try:
        step = asyncio.run(post_until_trimmed())
    finally:
        writer.stop()
    loop = threading.current_thread().name
    # the report that crossed the quota was tried on the loop, undone, then stored by
    # the thread, which trimmed; every report before it was stored on the loop
    assert job.threads[:-2] == [loop] * step and job.threads[-2:] == [loop, "air-report-writer"]
    events = job.store.read_events(job.id, limit=100_000)
    assert [e.data["kind"] for e in events if e.type.value == "alert"] == ["quota"]
    steps = sorted(
        {p["step"] // 1000 for e in events if e.type.value == "metrics" for p in e.data["points"]}
    )
    assert steps[-1] == step and steps[0] > 0  # the newest kept, the oldest dropped
