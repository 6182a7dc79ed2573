"""What `air submit --follow` and `air logs -f` show, line by line, when not on a terminal."""

from __future__ import annotations

from pathlib import Path

from clitest import FakeGateway, invoke

from air_sdk.schema import JobState


def test_follow_streams_rank_0_between_the_state_lines_and_ends_with_the_summary(
    gateway: FakeGateway, script: Path
) -> None:
    gateway.rank0_output = ["epoch 1 done", "[bold]not markup[/]"]
    result = invoke("submit", "train.py", "--follow")
    assert result.exit_code == 0, result.output
    print(result.stdout)
    assert result.stdout.splitlines() == [
        "j-1",
        "QUEUED      j-1",
        "SCHEDULED   j-1",
        "STARTING    j-1",
        "RUNNING     j-1",
        "[rank 0] epoch 1 done",
        "[rank 0] [bold]not markup[/]",
        "SUCCEEDED   j-1  step 3  loss 0.3333  1.0 steps/s",
        "job           j-1 (train)",
        "final state   SUCCEEDED",
        "attempts      1",
        "steps         3",
        "final loss    0.3333",
        "steps/second  1.0",
    ]


def test_the_summary_of_a_plain_script_says_what_is_known_instead_of_dashes(
    gateway: FakeGateway, script: Path
) -> None:
    gateway.steps = 0  # a torchrun script that never calls air.log
    gateway.ended_record = {"started_at": 100.0, "ended_at": 142.2, "goodput": 0.971}
    result = invoke("submit", "train.py", "--nodes", "2", "--follow")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-4:] == [
        "job          j-1 (train)",
        "final state  SUCCEEDED",
        "attempts     1",
        "run          ran 42 s, 2 ranks, exit 0, goodput 97%",
    ]
    assert "-" not in "".join(result.stdout.splitlines()[-4:]).replace("j-1", "")


def test_logs_follow_ends_with_the_outcome(gateway: FakeGateway, script: Path) -> None:
    gateway.steps = 0
    gateway.ended_record = {"started_at": 100.0, "ended_at": 107.0, "goodput": 0.5}
    invoke("submit", "train.py", "--nodes", "2")
    result = invoke("logs", "-f", "j-1")
    assert result.exit_code == 0, result.output
    assert "job j-1 ended: SUCCEEDED (ran 7 s, 2 ranks, exit 0, goodput 50%)" in result.stderr


def test_follow_all_ranks_shows_every_rank_and_a_failure_once(
    gateway: FakeGateway, script: Path
) -> None:
    gateway.final_state = JobState.FAILED
    gateway.rank0_output = ["epoch 1 done"]
    result = invoke("submit", "train.py", "--follow", "--all-ranks")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[5:8] == [
        "[rank 0] epoch 1 done",
        "[rank 1] boom",
        "FAILED      j-1  step 3  loss 0.3333  1.0 steps/s",
    ]
    # rank 1's output is above: its last lines are not printed a second time
    assert lines[-2:] == ["failed: rank 1 exit code 3", "(rank 1's last lines are above)"]
    assert all(line == line.strip() for line in lines if not line.startswith("  "))


def test_follow_without_all_ranks_leaves_other_ranks_out(
    gateway: FakeGateway, script: Path
) -> None:
    result = invoke("submit", "train.py", "--follow")
    assert "[rank 1]" not in result.stdout


def test_follow_of_a_cancelled_job_exits_1_and_says_why(gateway: FakeGateway, script: Path) -> None:
    gateway.final_state = JobState.CANCELLED
    result = invoke("submit", "train.py", "--follow")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == "cancelled: no reason given"


def test_jobs_table_columns_line_up(gateway: FakeGateway) -> None:
    gateway.add_job("train-5d41402a", JobState.RUNNING, name="nightly")
    gateway.add_job("eval-0a1b2c3d", JobState.QUEUED, name="sweep")
    result = invoke("jobs")
    header, *rows = result.stdout.splitlines()
    for column, cells in (("STATE", ["QUEUED", "RUNNING"]), ("NAME", ["sweep", "nightly"])):
        assert [row.index(cell) for row, cell in zip(rows, cells, strict=True)] == [
            header.index(column)
        ] * 2
    assert all(line == line.rstrip() for line in result.stdout.splitlines())


def test_on_a_terminal_output_lines_print_above_the_live_line() -> None:
    import io

    from rich.console import Console

    from air_sdk.cli.terminal_views import ProgressView
    from air_sdk.schema import JobSnapshot

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    snapshot = JobSnapshot(job_id="train-5d41402a")
    with ProgressView(console) as view:
        view.update(snapshot)
        view.log(0, ["epoch 1 done"])
        snapshot.state = JobState.SUCCEEDED
        view.update(snapshot, force=True)
    shown = out.getvalue()
    assert "[rank 0] epoch 1 done" in shown
    # the live line is drawn last, after the output line, with the final state
    assert shown.rindex("SUCCEEDED   train-5d41402a") > shown.index("[rank 0] epoch 1 done")
