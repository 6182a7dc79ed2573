import pytest
from pydantic import ValidationError

from air_sdk.schema import Event, JobSnapshot, JobSpec, JobState, Resources
from air_sdk.schema.state import InvalidTransitionError, check_transition


def test_valid_spec_defaults():
    spec = JobSpec(entrypoint="train.py", resources=Resources(nodes=2))
    assert spec.resources.world_size == 2
    assert spec.api_version == "air/v1"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"entrypoint": "t.py", "resources": {"nodes": 0}}, "resources.nodes"),
        ({"entrypoint": "/etc/passwd"}, "entrypoint"),
        ({"entrypoint": "../x.py"}, "entrypoint"),
        ({"entrypoint": "t.py", "name": "has space"}, "name"),
        ({"entrypoint": "t.py", "env": {"RANK": "3"}}, "env"),
        ({"entrypoint": "t.py", "env": {"AIR_JOB_ID": "x"}}, "env"),
        ({"entrypoint": "t.py", "max_restarts": -1}, "max_restarts"),
        ({"entrypoint": "t.py", "unknown": 1}, "unknown"),
    ],
)
def test_invalid_specs_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        JobSpec(**kwargs)
    locs = {".".join(str(p) for p in e["loc"]) for e in info.value.errors()}
    assert any(loc.startswith(field) for loc in locs), locs


def test_exactly_one_program():
    with pytest.raises(ValidationError, match="exactly one of entrypoint"):
        JobSpec()
    with pytest.raises(ValidationError, match="exactly one of entrypoint"):
        JobSpec(entrypoint="a.py", code="print(1)")


def test_gpus_imply_one_rank_per_gpu():
    assert Resources(nodes=2, gpus_per_node=8).world_size == 16
    with pytest.raises(ValidationError, match="one rank per GPU"):
        Resources(procs_per_node=3, gpus_per_node=8)


def test_terminal_states_are_final():
    assert JobState.SUCCEEDED.terminal and not JobState.RUNNING.terminal
    check_transition(JobState.QUEUED, JobState.SCHEDULED)
    with pytest.raises(InvalidTransitionError):
        check_transition(JobState.SUCCEEDED, JobState.RUNNING)
    with pytest.raises(InvalidTransitionError):
        check_transition(JobState.QUEUED, JobState.RUNNING)


def ev(seq, type, data, rank=None):
    return Event(seq=seq, job_id="j", ts=float(seq), type=type, data=data, rank=rank)


def test_snapshot_folds_events_and_ignores_repeats():
    events = [
        ev(1, "state", {"state": "QUEUED"}),
        ev(2, "attempt", {"attempt": 1, "phase": "started"}),
        ev(3, "state", {"state": "RUNNING"}),
        ev(
            4,
            "metrics",
            {
                "points": [
                    {"step": 1, "ts": 10.0, "values": {"loss": 2.0}},
                    {"step": 11, "ts": 12.0, "values": {"loss": 1.0}},
                ]
            },
            rank=0,
        ),
        ev(5, "log", {"lines": ["hello"]}, rank=1),
        ev(6, "state", {"state": "SUCCEEDED", "reason": "every rank exited 0"}),
    ]
    snap = JobSnapshot.fold("j", events)
    snap.apply(events[3])  # a repeat after a reconnect changes nothing
    assert snap.state is JobState.SUCCEEDED and snap.attempt == 1
    assert snap.step == 11 and snap.latest["loss"] == 1.0
    assert snap.series["loss"] == [(1, 2.0), (11, 1.0)]
    assert snap.steps_per_second == pytest.approx(5.0)
    assert snap.log_tail[1] == ["hello"]
    assert snap.last_seq == 6


def test_snapshot_keeps_failure_utilization_and_checkpoints():
    events = [
        ev(
            1,
            "state",
            {
                "state": "RESTARTING",
                "reason": "rank 1 exit code 3",
                "failure": {
                    "attempt": 1,
                    "reason": "rank 1 exit code 3",
                    "rank": 1,
                    "exit_code": 3,
                },
            },
        ),
        ev(
            2,
            "util",
            {
                "samples": [
                    {"node": "node-0", "device": "cpu", "ts": 2.0, "util_pct": 50.0},
                    {"node": "node-0", "device": "cpu", "ts": 3.0, "util_pct": 75.0},
                ]
            },
            rank=0,
        ),
        ev(3, "checkpoint", {"step": 100, "path": "/ckpt/100"}),
    ]
    snap = JobSnapshot.fold("j", events)
    assert snap.failure is not None and (snap.failure.rank, snap.failure.exit_code) == (1, 3)
    assert snap.num_restarts == 1
    assert snap.utilization["node-0/cpu"].util_pct == 75.0
    assert [c["step"] for c in snap.checkpoints] == [100]
