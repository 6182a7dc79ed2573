"""What a user needs to act on is in `air status` and the `--follow` summary, not only in
`--json`: where each rank of a hung job stood, what goodput counts, a failing rank's
output once (issue 21 item 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from clitest import FakeGateway, flat, invoke

from air_sdk.runtime import _rank_main
from air_sdk.schema import FailureInfo, JobState

SITE = "/venv/lib/python3.11/site-packages"


def _dump(pid: int, *frames: str) -> str:
    """A `py-spy dump` as the runner stores it."""
    body = "\n".join(f"    {f}" for f in frames)
    return (
        f"Process {pid}: python -u train.py\nPython v3.11.9 (/usr/bin/python3.11)\n\n"
        f'Thread {pid} (idle): "MainThread"\n{body}\n'
        f'Thread {pid + 1} (idle): "pt_elastic"\n    wait (/usr/lib/python3.11/threading.py:331)'
    )


HANG = FailureInfo(
    attempt=1,
    kind="hang",
    reason="no progress from rank 1 (last step 3) for 60 s (hang_timeout_s)",
    rank=1,
    stalled_ranks=[1],
    stacks={
        0: _dump(
            70,
            f"all_reduce ({SITE}/torch/distributed/distributed_c10d.py:2806)",
            f"wrapper ({SITE}/torch/distributed/c10d_logger.py:81)",
            "step (/var/lib/air/jobs/train-1/code/train.py:31)",
            "<module> (/var/lib/air/jobs/train-1/code/train.py:40)",
        ),
        1: _dump(71, "load_shard (/var/lib/air/jobs/train-1/code/data.py:12)"),
    },
)


def test_status_shows_where_each_hung_rank_stood(gateway: FakeGateway) -> None:
    gateway.add_job("train-1", JobState.FAILED, failure=HANG)

    result = invoke("status", "train-1")

    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "failed: no progress from rank 1 (last step 3) for 60 s (hang_timeout_s)" in lines
    assert "stalled: rank 1" in lines
    assert "rank 0 at all_reduce (distributed_c10d.py:2806) in step (train.py:31)" in lines
    assert "rank 1 at load_shard (data.py:12)" in lines
    assert "exit code None" not in result.stdout


def test_follow_summary_of_a_hung_job_shows_each_ranks_top_frame(
    gateway: FakeGateway, script: Path
) -> None:
    gateway.final_state = JobState.FAILED
    gateway.ended_record = {"failure": HANG}

    result = invoke("submit", "train.py", "--follow")

    assert result.exit_code == 1, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "rank 0 at all_reduce (distributed_c10d.py:2806) in step (train.py:31)" in lines
    assert "every frame: air status --json" in lines


def test_status_says_what_goodput_counts(gateway: FakeGateway) -> None:
    gateway.add_job("train-2", JobState.SUCCEEDED, goodput=0.313, productive_s=9.2, wall_s=29.4)

    result = invoke("status", "train-2")

    assert result.exit_code == 0, result.output
    assert "goodput 31% (training 9 s of 29 s; start-up 20 s)" in flat(result.stdout)


def test_follow_summary_says_what_goodput_counts(gateway: FakeGateway, script: Path) -> None:
    gateway.ended_record = {
        "goodput": 0.313,
        "productive_s": 9.2,
        "wall_s": 29.4,
        "started_at": 100.0,
        "ended_at": 129.4,
    }

    result = invoke("submit", "train.py", "--follow")

    assert result.exit_code == 0, result.output
    assert "goodput 31% (training 9 s of 29 s; start-up 20 s)" in flat(result.stdout)


def test_goodput_after_a_restart_does_not_call_the_lost_time_start_up(
    gateway: FakeGateway,
) -> None:
    gateway.add_job("train-3", JobState.SUCCEEDED, goodput=0.5, productive_s=30.0, wall_s=60.0)
    gateway.records["train-3"] = gateway.records["train-3"].model_copy(update={"attempt": 2})

    result = invoke("status", "train-3")

    assert "(training 30 s of 60 s; start-up, failed attempts and redone work 30 s)" in flat(
        result.stdout
    )


def test_follow_prints_a_failing_ranks_traceback_once(gateway: FakeGateway, script: Path) -> None:
    gateway.final_state = JobState.FAILED
    trace = ["Traceback (most recent call last):", '  File "train.py", line 3', "ValueError: x"]
    gateway.ended_record = {
        "failure": FailureInfo(
            attempt=1, reason="rank 0 exit code 1", rank=0, exit_code=1, log_tail=trace
        )
    }
    gateway.rank0_output = trace

    result = invoke("submit", "train.py", "--follow")

    assert result.exit_code == 1, result.output
    assert result.stdout.count("ValueError: x") == 1
    assert "failed: rank 0 exit code 1" in result.stdout.splitlines()
    assert "rank 0 exit code 1: rank 0 exit code 1" not in result.stdout


def _real_traceback(tmp_path: Path, job_id: str) -> list[str]:
    """What a rank prints when the user's module raises, run as AIR runs it: by the rank
    launcher, in the job's code directory on the gateway."""
    code = tmp_path / "home" / "jobs" / job_id / "code"
    code.mkdir(parents=True)
    (code / "helper.py").write_text('def main():\n    raise ValueError("bad lr")\n')
    (code / "train.py").write_text("import helper\nhelper.main()\n")
    launcher = Path(_rank_main.__file__)
    ran = subprocess.run(
        [sys.executable, "-u", str(launcher), "-m", "train"],
        cwd=code,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1 and "_rank_main.py" in ran.stderr  # the raw traceback has it
    return ran.stderr.splitlines()


def test_a_failures_traceback_shows_the_users_frames_and_paths(
    gateway: FakeGateway, tmp_path: Path
) -> None:
    tail = _real_traceback(tmp_path, "train-4")
    failure = FailureInfo(attempt=1, reason="", rank=0, exit_code=1, log_tail=tail)
    gateway.add_job("train-4", JobState.FAILED, failure=failure)

    result = invoke("status", "train-4")

    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert 'File "train.py", line 2, in <module>' in lines
    assert 'File "helper.py", line 2, in main' in lines
    assert "ValueError: bad lr" in lines
    assert "_rank_main" not in result.stdout and "runpy" not in result.stdout
    assert "/jobs/train-4/code/" not in result.stdout
