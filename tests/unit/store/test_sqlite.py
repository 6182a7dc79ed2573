import threading

import pytest

from air_sdk.schema import EventType, JobSpec, JobState, LogBatch, NodeAssignment, Placement
from air_sdk.store import IdempotencyConflict, SqliteStore


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "air.db")
    yield s
    s.close()


def spec(**kw):
    return JobSpec(entrypoint="train.py", **kw)


def test_same_idempotency_key_returns_the_same_job(store):
    a, created_a = store.create_job(spec(), tenant="default", idempotency_key="k1")
    b, created_b = store.create_job(spec(), tenant="default", idempotency_key="k1")
    assert created_a and not created_b and a.id == b.id
    assert len(store.list_jobs()) == 1


def test_same_key_other_body_is_refused(store):
    store.create_job(spec(), tenant="default", idempotency_key="k1")
    with pytest.raises(IdempotencyConflict):
        store.create_job(spec(max_restarts=2), tenant="default", idempotency_key="k1")


def test_every_transition_is_an_event_with_gapless_seq(store):
    job, _ = store.create_job(spec(), tenant="default")
    store.transition(job.id, JobState.SCHEDULED, "placed")
    store.start_attempt(
        job.id, Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    )
    store.transition(job.id, JobState.STARTING, "launch")
    store.transition(job.id, JobState.RUNNING, "up")
    store.transition(job.id, JobState.SUCCEEDED, "done")
    events = store.read_events(job.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    states = [e.data["state"] for e in events if e.type is EventType.STATE]
    assert states == ["QUEUED", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert store.get_job(job.id).ended_at is not None
    # a terminal state is final
    with pytest.raises(ValueError):
        store.transition(job.id, JobState.RUNNING, "again")


def test_worker_tokens_are_fenced_by_attempt(store):
    job, _ = store.create_job(spec(), tenant="default")
    p = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    a1, t1 = store.start_attempt(job.id, p)
    assert store.check_worker_token(job.id, a1, t1) == "ok"
    assert store.check_worker_token(job.id, a1, "nope") == "invalid"
    a2, t2 = store.start_attempt(job.id, p)
    assert store.check_worker_token(job.id, a1, t1) == "stale"
    assert store.check_worker_token(job.id, a2, t2) == "ok"
    assert store.check_worker_token(job.id, a2, t1) == "invalid"


def test_a_remembered_verdict_never_outlives_the_end_of_its_attempt_or_job(store):
    # Verdicts of running attempts are remembered (a rank posts twice a second); an end
    # must fence the token at once all the same.
    job, _ = store.create_job(spec(), tenant="default")
    p = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    a1, t1 = store.start_attempt(job.id, p)
    assert store.check_worker_token(job.id, a1, t1) == "ok"  # remembered now
    store.end_attempt(job.id, a1, "crashed")
    assert store.check_worker_token(job.id, a1, t1) == "ok"  # within the grace
    assert store.check_worker_token(job.id, a1, t1, ended_grace_s=0) == "stale"
    # a job that ends without its attempt being closed (a runner that lost it)
    a2, t2 = store.start_attempt(job.id, p)
    store.transition(job.id, JobState.SCHEDULED, "placed")
    assert store.check_worker_token(job.id, a2, t2) == "ok"
    store.transition(job.id, JobState.CANCELLED, "cancelled")
    assert store.check_worker_token(job.id, a2, t2, ended_grace_s=0) == "stale"


def test_a_verdict_read_while_its_attempt_ends_is_not_remembered(store, monkeypatch):
    job, _ = store.create_job(spec(), tenant="default")
    p = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    a1, t1 = store.start_attempt(job.id, p)
    db = store._db
    read = db.read
    ended = []

    def read_then_end(sql, args=()):  # the runner ends the attempt right after the SELECT
        rows = read(sql, args)
        if "token_hash" in sql and not ended:
            ended.append(True)
            store.end_attempt(job.id, a1, "lost")
        return rows

    monkeypatch.setattr(db, "read", read_then_end)
    assert store.check_worker_token(job.id, a1, t1) == "ok"  # read before the end
    monkeypatch.setattr(db, "read", read)
    assert store.check_worker_token(job.id, a1, t1, ended_grace_s=0) == "stale"


def test_tokens_are_stored_hashed(store, tmp_path):
    token = store.create_token(role="admin")
    assert store.lookup_token(token) == ("default", "admin")
    assert token.encode() not in (tmp_path / "air.db").read_bytes()


def test_tenants_see_only_their_jobs(store):
    job, _ = store.create_job(spec(), tenant="default")
    assert store.get_job(job.id, tenant="other") is None
    assert store.list_jobs(tenant="other") == []


def test_concurrent_appends_keep_seq_gapless(store):
    job, _ = store.create_job(spec(), tenant="default")

    def worker(rank):
        for _ in range(50):
            store.append_worker_events(job.id, 1, rank, [LogBatch(lines=["x"])], None)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [e.seq for e in store.read_events(job.id, limit=10_000)]
    assert seqs == list(range(1, 202))
    assert store.last_seq(job.id) == 201


def test_queue_position_is_fifo(store):
    a, _ = store.create_job(spec(), tenant="default")
    b, _ = store.create_job(spec(), tenant="default")
    assert store.queue_position(a.id) == 1 and store.queue_position(b.id) == 2
    store.request_cancel(a.id)
    assert store.get_job(a.id).state is JobState.CANCELLED
    assert store.queue_position(b.id) == 1


def test_an_ended_attempt_is_fenced_after_a_grace(store):
    job, _ = store.create_job(spec(), tenant="default")
    p = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    attempt, token = store.start_attempt(job.id, p)
    store.end_attempt(job.id, attempt, "cancelled by user")
    # the last lines and exit records of ranks that just ended still get in ...
    assert store.check_worker_token(job.id, attempt, token) == "ok"
    # ... a straggler long after the end does not
    assert store.check_worker_token(job.id, attempt, token, ended_grace_s=-1) == "stale"


def test_typed_event_reads_use_the_type_index(store):
    # The controller reads rank exits every tick; without the (job, type, seq) index that
    # read scans every metrics row of the job. Check the plan of the SQL read_events runs.
    job, _ = store.create_job(spec(), tenant="default")
    seen: list[str] = []
    store._db.reader().set_trace_callback(seen.append)
    store.read_events(job.id, types=(EventType.RANK_EXIT,), attempt=1)
    store._db.reader().set_trace_callback(None)
    (sql,) = [q for q in seen if q.lstrip().upper().startswith("SELECT")]
    plan = store._db.reader().execute("EXPLAIN QUERY PLAN " + sql).fetchall()
    assert any("events_type" in str(tuple(row)) for row in plan), plan


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tenant": "default", "limit": 100},  # `air jobs`
        {"states": (JobState.QUEUED,), "oldest_first": True, "limit": 10_000},  # the runner
    ],
)
def test_job_lists_read_in_queue_order_from_an_index_not_a_sort(store, kwargs):
    # With 10,000 jobs in history a sort would read every one of them for each list.
    seen: list[str] = []
    store._db.reader().set_trace_callback(seen.append)
    store.list_jobs(**kwargs)
    store._db.reader().set_trace_callback(None)
    (sql,) = [q for q in seen if q.lstrip().upper().startswith("SELECT")]
    plan = " ".join(str(tuple(r)) for r in store._db.reader().execute("EXPLAIN QUERY PLAN " + sql))
    assert "TEMP B-TREE" not in plan and "_order" in plan, plan


def test_the_store_offers_every_method_of_its_parts(store):
    # SqliteStore binds its parts' methods by name: a method added to a part but not
    # bound there would be missing for the gateway and the runner.
    from air_sdk.store.attempts import AttemptStore
    from air_sdk.store.auth import AuthStore
    from air_sdk.store.bundles import BundleIndex
    from air_sdk.store.events import EventLog
    from air_sdk.store.jobs import JobStore
    from air_sdk.store.nodes import NodeHealthStore

    within_the_store = {"append", "scrub_failure"}  # EventLog's, for the other parts
    for part in (AuthStore, BundleIndex, JobStore, AttemptStore, EventLog, NodeHealthStore):
        for name in dir(part):
            if name.startswith("_") or name in within_the_store:
                continue
            bound = getattr(store, name, None)
            assert getattr(bound, "__func__", None) is getattr(part, name), (
                f"{part.__name__}.{name}"
            )
