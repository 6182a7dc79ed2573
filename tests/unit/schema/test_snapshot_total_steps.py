"""The run's length and its step count, as every view reads them from the snapshot."""

from __future__ import annotations

from air_sdk.schema import Event, JobSnapshot, JobSpec


def metrics(seq: int, step: int, **values: float) -> Event:
    return Event(
        seq=seq,
        job_id="j",
        ts=float(seq),
        type="metrics",
        rank=0,
        data={"points": [{"step": step, "ts": float(seq), "values": values}]},
    )


def test_a_logged_total_replaces_the_specs_and_old_snapshots_still_load():
    snap = JobSnapshot(
        job_id="j", total_steps=JobSpec(entrypoint="t.py", total_steps=100).total_steps
    )
    assert snap.total_steps == 100
    snap.apply(metrics(1, 0, loss=1.0, total_steps=150))
    assert snap.total_steps == 150
    old = JobSnapshot.model_validate_json('{"job_id": "j", "step": 3}')  # before the field
    assert old.total_steps is None
    assert JobSpec.model_validate({"entrypoint": "t.py"}).total_steps is None


def test_steps_done_counts_a_zero_based_and_a_one_based_loop_alike():
    zero, one = JobSnapshot(job_id="j"), JobSnapshot(job_id="j")
    for i in range(150):
        zero.apply(metrics(i + 1, i, loss=1.0))
        one.apply(metrics(i + 1, i + 1, loss=1.0))
    assert (zero.step, zero.steps_done) == (149, 150)
    assert (one.step, one.steps_done) == (150, 150)


def test_an_unset_total_leaves_the_wire_form_as_before():
    # a gateway from before the field (extra="forbid") still takes what this client sends
    assert "total_steps" not in JobSpec(entrypoint="t.py").model_dump(mode="json")
    assert JobSpec(entrypoint="t.py", total_steps=5).model_dump(mode="json")["total_steps"] == 5
