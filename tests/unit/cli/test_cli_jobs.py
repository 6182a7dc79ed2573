"""`air status|logs|cancel` without a job id mean your newest job; `air cancel --all`
asks first; `air logs` checks --rank and exits as `--follow` does."""

from __future__ import annotations

import pytest
from clitest import FakeGateway, flat, invoke

from air_sdk.cli import main as cli
from air_sdk.schema import JobState


@pytest.fixture
def three_jobs(gateway: FakeGateway) -> FakeGateway:
    gateway.add_job("train-00000001", JobState.SUCCEEDED)
    gateway.add_job("train-00000002", JobState.RUNNING)
    gateway.add_job("train-00000003", JobState.QUEUED, name="eval")
    return gateway


def test_status_without_a_job_is_the_newest_and_says_so_on_stderr(three_jobs: FakeGateway) -> None:
    result = invoke("status")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("train-00000003  eval  QUEUED")
    assert result.stderr.strip() == (
        "job train-00000003 (eval, QUEUED): your newest; `air status JOB` for another"
    )


def test_logs_and_cancel_without_a_job_take_the_newest(three_jobs: FakeGateway) -> None:
    three_jobs.emit("train-00000003", "log", rank=0, lines=["hello"])
    logs = invoke("logs")
    assert logs.exit_code == 0, logs.output
    assert logs.stdout == "[rank 0] hello\n"
    assert "job train-00000003 (eval, QUEUED): your newest" in logs.stderr
    cancel = invoke("cancel")
    assert cancel.exit_code == 0, cancel.output
    assert "cancel requested for job train-00000003" in cancel.stdout
    assert three_jobs.records["train-00000003"].cancel_requested
    assert not three_jobs.records["train-00000002"].cancel_requested


def test_no_jobs_at_all_is_one_clear_line(gateway: FakeGateway) -> None:
    result = invoke("logs")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: you have no jobs on http://gw.test yet: submit one with `air submit`"
    )


def test_cancel_all_off_a_terminal_without_yes_refuses_and_says_why(
    three_jobs: FakeGateway,
) -> None:
    result = invoke("cancel", "--all")
    assert result.exit_code == 2
    assert (
        "Invalid value for '--all': this would cancel 2 jobs that have not ended"
        " (train-00000003, train-00000002); nobody can confirm here (not a terminal):"
        " add --yes to cancel them" in flat(result.output)
    )
    assert not any(r.cancel_requested for r in three_jobs.records.values())


def test_cancel_all_yes_cancels_every_job_that_has_not_ended(three_jobs: FakeGateway) -> None:
    result = invoke("cancel", "--all", "--yes")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "cancel requested for job train-00000003 (now CANCELLED)",
        "cancel requested for job train-00000002 (now CANCELLED)",
    ]
    assert three_jobs.records["train-00000001"].state is JobState.SUCCEEDED


@pytest.mark.parametrize(("answer", "code", "cancelled"), [("y\n", 0, True), ("\n", 1, False)])
def test_cancel_all_on_a_terminal_asks_first(
    three_jobs: FakeGateway,
    monkeypatch: pytest.MonkeyPatch,
    answer: str,
    code: int,
    cancelled: bool,
) -> None:
    monkeypatch.setattr(cli, "_stdin_is_terminal", lambda: True)
    result = invoke("cancel", "--all", answer=answer)
    assert result.exit_code == code, result.output
    assert "cancel 2 jobs that have not ended (train-00000003, train-00000002)? [y/N]" in (
        result.stderr
    )
    assert three_jobs.records["train-00000002"].cancel_requested is cancelled
    if not cancelled:
        assert "nothing cancelled" in result.stderr


def test_cancel_all_with_nothing_running_says_so(gateway: FakeGateway) -> None:
    gateway.add_job("train-00000001", JobState.FAILED)
    result = invoke("cancel", "--all")
    assert result.exit_code == 0 and result.stdout == "no queued or running jobs to cancel\n"


def test_logs_of_a_rank_the_job_does_not_have_names_its_ranks(gateway: FakeGateway) -> None:
    gateway.add_job("train-00000001", JobState.RUNNING)  # 2 nodes x 1 rank
    result = invoke("logs", "train-00000001", "--rank", "5")
    assert result.exit_code == 2
    assert (
        "Invalid value for '--rank': job train-00000001 has ranks 0-1; there is no rank 5"
        in flat(result.output)
    )


@pytest.mark.parametrize(
    ("final", "code"), [(JobState.SUCCEEDED, 0), (JobState.FAILED, 1), (JobState.CANCELLED, 1)]
)
def test_logs_follow_exits_as_follow_does(gateway: FakeGateway, final: JobState, code: int) -> None:
    gateway.add_job("train-00000001", JobState.RUNNING)
    gateway.run_to_end("train-00000001", final)
    result = invoke("logs", "train-00000001", "-f")
    assert result.exit_code == code, result.output
    assert f"job train-00000001 ended: {final.value}" in result.stderr
