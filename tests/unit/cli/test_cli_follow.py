"""What `air submit --follow` and `air logs -f` show, line by line, when not on a terminal."""

from __future__ import annotations

from pathlib import Path

from clitest import FakeGateway, invoke


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
