"""Event payloads: every event type has a model, round-trips through it, and the rows
earlier versions stored still read."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from air_sdk.schema import JobSnapshot, JobState
from air_sdk.schema.events import (
    PAYLOAD_MODELS,
    Alert,
    AttemptChange,
    CheckpointCommit,
    CheckpointRestore,
    CheckpointSkip,
    DeviceSample,
    Event,
    EventPayload,
    EventType,
    ExportStatus,
    FailureInfo,
    FunctionResult,
    LogBatch,
    MetricPoint,
    MetricsBatch,
    NodeAssignment,
    Placement,
    RankExit,
    SloBurn,
    StateChange,
    UtilBatch,
    WorkerReport,
    event_type_of,
    parse_payload,
)

PLACEMENT = Placement(job_id="j", nodes=(NodeAssignment(node="node-0", slots=2, gpus=(0, 1)),))
FAILURE = FailureInfo(
    attempt=1,
    reason="rank 1 exit code 3",
    rank=1,
    exit_code=3,
    log_tail=["boom"],
    rank_exits=[RankExit(rank=1, exit_code=3)],
    stacks={1: "File train.py"},
)
COMMIT = CheckpointCommit(
    step=100,
    path="/ck/100",
    world_size=2,
    size_bytes=2048,
    num_files=3,
    blocked_s=0.05,
    durable_s=1.5,
    attempt=1,
    snapshot="fork",
)

#: one of every payload model, as a writer makes it
PAYLOADS: list[EventPayload] = [
    StateChange(state=JobState.QUEUED, reason="submitted"),
    StateChange(
        state=JobState.RESTARTING, previous=JobState.RUNNING, reason="crash", failure=FAILURE
    ),
    AttemptChange(attempt=1, phase="started", placement=PLACEMENT, resumed_from_step=40),
    AttemptChange(attempt=1, phase="ended", reason="rank 1 exit code 3"),
    MetricsBatch(
        points=[MetricPoint(step=1, ts=1.5, values={"loss": math.inf, "lr": 0.1})],
        dropped_points=2,
    ),
    LogBatch(lines=["step 1", "step 2"]),
    RankExit(rank=1, node="node-0", ended_at=3.0, signal="SIGKILL", oom_killed=True, tail=["x"]),
    COMMIT,
    CheckpointSkip(step=6, path="/ck/6", skipped="__1_0.distcp: missing", attempt=2),
    CheckpointRestore(step=40, path="/ck/40", attempt=2),
    UtilBatch(samples=[DeviceSample(node="node-0", device="gpu0", ts=2.0, util_pct=93.0)]),
    Alert(kind="straggler", rank=3, detail="rank 3's step time stays above 2x"),
    FunctionResult(ok=True, value_b64="gARLAy4=", size_bytes=5),  # pickle.dumps(3)
    ExportStatus(to="mlflow", state="failed", error="no tracking server at http://x"),
    FunctionResult(
        ok=False,
        error_type="ValueError",
        error="bad lr",
        traceback='Traceback (most recent call last):\n  File "<air call>", line 1\nValueError: bad lr',
    ),
    SloBurn(
        tenant="acme",
        slo="queue-wait",
        kind="queue_wait",
        target=600.0,
        objective=0.95,
        value=900.0,
        budget_left=-1.5,
        burn_rate=2.5,
        threshold=0.5,
        jobs=["train-1a2b3c4d"],
    ),
]


def test_every_event_type_has_a_payload_model_and_a_sample_here():
    assert set(PAYLOAD_MODELS) == set(EventType)
    sampled = {type(p) for p in PAYLOADS}
    assert sampled == {m for models in PAYLOAD_MODELS.values() for m in models}


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_every_payload_round_trips_through_the_wire(payload):
    event = Event.of(payload, seq=7, job_id="j", ts=1.0, attempt=1, rank=0)
    assert event.type is event_type_of(payload)
    wire = event.model_dump_json()  # what the gateway streams and the store keeps
    back = Event.model_validate_json(wire)
    assert back == event
    read = back.payload()
    assert type(read) is type(payload)
    if isinstance(payload, MetricsBatch):  # inf survives as the JSON constant
        assert read.points[0].values["loss"] == math.inf
    else:
        assert read == payload


# Rows as earlier versions of the store and the report route wrote them (dicts built by
# hand, before the payload models): they must read back the same.
OLD_ROWS = [
    ("state", '{"state": "QUEUED", "previous": null, "reason": "submitted"}'),
    (
        "state",
        '{"state": "RESTARTING", "previous": "RUNNING", "reason": "crash", "failure":'
        ' {"attempt": 1, "reason": "crash", "kind": "crash", "node": null, "rank": 1,'
        ' "exit_code": 3, "signal": null, "log_tail": ["boom"], "rank_exits": [],'
        ' "stalled_ranks": [], "stacks": {"1": "File x"}, "charged": true}}',
    ),
    (
        "attempt",
        '{"attempt": 2, "phase": "started", "placement": {"job_id": "j", "nodes":'
        ' [{"node": "node-0", "slots": 1, "gpus": []}], "pool": "default"},'
        ' "resumed_from_step": null}',
    ),
    ("attempt", '{"attempt": 2, "phase": "ended", "reason": "succeeded"}'),
    ("metrics", '{"points":[{"step":1,"ts":0.5,"values":{"loss":NaN}}],"dropped_points":0}'),
    ("log", '{"lines":["step 1"]}'),
    ("util", '{"samples":[{"node":"n","device":"cpu","ts":1.0,"util_pct":5.0}]}'),
    (
        "checkpoint",  # before `snapshot` and `at_failure` existed
        '{"step":10,"path":"/c/10","world_size":2,"size_bytes":5,"num_files":2,'
        '"blocked_s":0.1,"durable_s":0.2,"attempt":1}',
    ),
    ("checkpoint", '{"step":6,"path":"/c/6","skipped":"bad","attempt":1}'),
    ("checkpoint", '{"step":10,"path":"/c/10","restored":true,"attempt":2}'),
    ("rank_exit", '{"rank":1,"node":"n","exit_code":3,"signal":null,"tail":["x"]}'),
    ("alert", '{"kind": "straggler", "rank": 1, "detail": "slow"}'),
    ("alert", '{"kind": "reattached", "detail": "a restarted gateway re-attached"}'),
]


def test_rows_stored_by_earlier_versions_still_read_and_fold():
    events = [
        Event(seq=i, job_id="j", ts=float(i), type=t, attempt=1, rank=1, data=json.loads(d))
        for i, (t, d) in enumerate(OLD_ROWS, start=1)
    ]
    for event in events:
        event.payload()  # raises if a row no longer reads
    snap = JobSnapshot.fold("j", events)
    assert snap.state is JobState.RESTARTING and snap.failure is not None
    assert snap.failure.stacks == {1: "File x"}
    assert (snap.attempt, snap.step, snap.log_tail) == (2, 1, {1: ["step 1"]})
    assert [c.step for c in snap.checkpoints] == [10]
    assert [c.skipped for c in snap.skipped_checkpoints] == ["bad"]
    assert snap.resumed_from_step == 10
    assert snap.rank_exits[0].describe() == "rank 1 exit code 3"


def test_a_reader_ignores_fields_a_newer_gateway_adds_but_a_writer_cannot_add_one():
    data = {"lines": ["x"], "stream": "stderr"}
    assert parse_payload(EventType.LOG, data) == LogBatch(lines=["x"])
    with pytest.raises(ValidationError, match="stream"):
        LogBatch.model_validate(data)
    with pytest.raises(ValidationError, match="Field required"):
        parse_payload(EventType.STATE, {"reason": "no state"})


def test_payload_as_names_the_event_when_the_type_is_not_the_one_asked_for():
    event = Event.of(LogBatch(lines=[]), seq=3, job_id="j", ts=0.0)
    with pytest.raises(ValueError, match="event 3 of job j is a log event, not a StateChange"):
        event.payload_as(StateChange)


def test_a_worker_report_becomes_its_events_in_order():
    report = WorkerReport(
        rank=0,
        points=[MetricPoint(step=1, ts=0.0, values={"loss": 1.0})],
        lines=["step 1"],
        samples=[DeviceSample(node="n", device="cpu", ts=0.0)],
        checkpoints=[COMMIT],
        result=FunctionResult(ok=True, value_b64="gARLAy4=", size_bytes=5),
        exit=RankExit(rank=0, exit_code=0),
        heartbeat_step=1,
    )
    assert [event_type_of(p) for p in report.payloads()] == [
        EventType.METRICS,
        EventType.LOG,
        EventType.UTIL,
        EventType.CHECKPOINT,
        EventType.RESULT,  # before the exit: a reader that sees the exit has the value
        EventType.RANK_EXIT,
    ]
    assert WorkerReport(rank=0, heartbeat_step=3).payloads() == []
    assert WorkerReport(rank=0, dropped_points=4).payloads() == [MetricsBatch(dropped_points=4)]
