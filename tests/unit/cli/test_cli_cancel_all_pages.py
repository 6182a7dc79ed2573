"""`air cancel --all` cancels every job, past the gateway's 1,000-job page (issue 19)."""

from __future__ import annotations

from clitest import FakeGateway, flat, invoke

from air_sdk.schema import JobState


def test_cancel_all_pages_past_the_first_thousand(gateway: FakeGateway) -> None:
    gateway.add_job("done-00000001", JobState.SUCCEEDED)
    for i in range(1205):
        gateway.add_job(f"q-{i:08d}", JobState.QUEUED)
    gateway.add_job("run-00000001", JobState.RUNNING)
    result = invoke("cancel", "--all", "--yes")
    assert result.exit_code == 0, result.output
    states = [r.state for r in gateway.records.values()]
    assert states.count(JobState.CANCELLED) == 1206
    assert gateway.records["done-00000001"].state is JobState.SUCCEEDED
    assert len(result.stdout.splitlines()) == 1206  # each job once


def test_the_question_says_there_may_be_more_than_a_page(gateway: FakeGateway) -> None:
    for i in range(1000):
        gateway.add_job(f"q-{i:08d}", JobState.QUEUED)
    result = invoke("cancel", "--all")
    assert result.exit_code == 2
    assert "this would cancel 1000 jobs or more that have not ended" in flat(result.output)
