"""Job states as users print them."""

from __future__ import annotations

from air_sdk.schema import JobRecord, JobSpec, JobState


def test_printing_a_state_prints_its_name(capsys) -> None:  # type: ignore[no-untyped-def]
    record = JobRecord(
        id="train-5d41402a",
        tenant="t",
        name="train",
        state=JobState.SUCCEEDED,
        spec=JobSpec(entrypoint="train.py"),
        created_at=0,
        updated_at=0,
    )
    print(record.state)
    print(f"{record.state} after {record.attempt} attempts")
    assert capsys.readouterr().out == "SUCCEEDED\nSUCCEEDED after 0 attempts\n"
    assert repr(record.state) == "<JobState.SUCCEEDED: 'SUCCEEDED'>"  # repr stays precise
