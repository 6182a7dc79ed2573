"""`python -m air_sdk.runtime.supervise SCRIPT`: what a rank's supervisor shows and reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_runtime_shipper import FakeGateway

import air_sdk
from air_sdk.schema.events import RankExit, WorkerReport

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

REPO_ROOT = Path(air_sdk.__file__).resolve().parents[1]


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


class Supervised:
    """A supervisor subprocess whose stdout lines are collected as they come."""

    def __init__(self, cwd: Path, args: list[str], env: dict[str, str], **popen: object) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "air_sdk.runtime.supervise", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **popen,  # type: ignore[call-overload]
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, line: str) -> None:
        wait_until(lambda: line in self.lines)

    def finish(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    started: list[Supervised] = []

    def start(script: str, *args: str, env: dict[str, str] | None = None, **popen: object):
        (tmp_path / "train.py").write_text(textwrap.dedent(script))
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIR_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE")
        }
        base["PYTHONPATH"] = str(REPO_ROOT)
        supervised = Supervised(tmp_path, ["train.py", *args], {**base, **(env or {})}, **popen)
        started.append(supervised)
        return supervised

    yield start
    for supervised in started:
        if supervised.proc.poll() is None:
            supervised.proc.kill()
            supervised.proc.wait()


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    gw = FakeGateway()
    yield gw
    gw.close()


def air_env(gateway: FakeGateway, tmp_path: Path, rank: int = 0) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "AIR_JOB_ID": "job-1",
        "AIR_ATTEMPT": "0",
        "AIR_GATEWAY_URL": gateway.base_url,
        "AIR_JOB_TOKEN": "tok",
        "AIR_ATTEMPT_DIR": str(tmp_path / "attempt"),
    }


def test_output_is_prefixed_shipped_and_the_exit_code_passes_through(
    run: Callable[..., Supervised], gateway: FakeGateway, tmp_path: Path
) -> None:
    supervised = run(
        """
        import sys
        print("hello", sys.argv[1:])
        print("to stderr", file=sys.stderr)
        print("x" * 100_000)  # longer than one read: the rest of it is dropped
        print("bye")
        sys.exit(3)
        """,
        "--lr",
        "1",
        env=air_env(gateway, tmp_path, rank=2),
    )
    assert supervised.finish() == 3

    assert supervised.lines[:2] == ["[rank 2] hello ['--lr', '1']", "[rank 2] to stderr"]
    assert supervised.lines[3] == "[rank 2] bye"
    reports = [WorkerReport.model_validate(body) for body in gateway.reports]
    lines = [line for report in reports for line in report.lines]
    assert lines == ["hello ['--lr', '1']", "to stderr", "x" * 16384, "bye"]
    final = reports[-1].exit
    assert final is not None
    assert (final.rank, final.exit_code, final.signal, final.oom_killed) == (2, 3, None, False)
    assert final.tail == lines
    on_disk = RankExit.model_validate_json((tmp_path / "attempt/exits/rank-2.json").read_text())
    assert on_disk == final
    assert sorted(p.name for p in (tmp_path / "attempt/exits").iterdir()) == ["rank-2.json"]


def test_without_air_env_it_only_prefixes_and_passes_the_exit_code(
    run: Callable[..., Supervised], tmp_path: Path
) -> None:
    supervised = run("print('plain run')\n")
    assert supervised.finish() == 0
    assert supervised.lines == ["[rank 0] plain run"]
    assert not (tmp_path / "attempt").exists()


def test_a_signal_death_exits_128_plus_signal_with_the_last_lines(
    run: Callable[..., Supervised], gateway: FakeGateway, tmp_path: Path
) -> None:
    supervised = run(
        """
        import os, signal
        for step in range(1, 61):
            print(f"step {step}")
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        env=air_env(gateway, tmp_path),
    )
    assert supervised.finish() == 128 + signal.SIGKILL

    expected_tail = [f"step {step}" for step in range(11, 61)]
    on_disk = json.loads((tmp_path / "attempt/exits/rank-0.json").read_text())
    assert on_disk == {
        "rank": 0,
        "node": on_disk["node"],  # AIR_NODE_NAME, else this host's name
        "ended_at": on_disk["ended_at"],
        "exit_code": None,
        "signal": "SIGKILL",
        "oom_killed": False,
        "tail": expected_tail,
        "limit": None,  # no limit of the job's (`JobSpec.limits`) was hit
    }
    assert gateway.reports[-1]["exit"] == on_disk


def test_sigterm_to_the_supervisor_reaches_the_script(run: Callable[..., Supervised]) -> None:
    supervised = run(
        """
        import signal, sys, time
        def stop(signum, frame):
            print("got SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("ready")
        time.sleep(60)
        """
    )
    supervised.wait_for_line("[rank 0] ready")
    supervised.proc.send_signal(signal.SIGTERM)
    assert supervised.finish() == 0
    assert supervised.lines.count("[rank 0] got SIGTERM") == 1


def test_a_torchrun_style_group_sigterm_runs_the_handler_once(
    run: Callable[..., Supervised],
) -> None:
    # torchrun starts each worker in a new session and stops it with killpg, which
    # reaches the script directly: the supervisor must not deliver a second SIGTERM.
    supervised = run(
        """
        import signal, time
        calls = []
        signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(print("got SIGTERM")))
        print("ready")
        while not calls:
            time.sleep(0.01)
        time.sleep(0.5)  # room for a duplicate to arrive
        """,
        env={"TORCHELASTIC_RUN_ID": "run-1"},
        start_new_session=True,
    )
    supervised.wait_for_line("[rank 0] ready")
    os.killpg(supervised.proc.pid, signal.SIGTERM)
    assert supervised.finish() == 0
    assert supervised.lines.count("[rank 0] got SIGTERM") == 1


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status  # a zombie waiting for init to reap it is dead


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_killing_the_supervisor_kills_the_script(run: Callable[..., Supervised]) -> None:
    supervised = run(
        """
        import os, time
        print("pid", os.getpid())
        time.sleep(60)
        """
    )
    wait_until(lambda: any(line.startswith("[rank 0] pid ") for line in supervised.lines))
    child_pid = int(supervised.lines[0].split()[-1])
    assert not _gone(child_pid)

    supervised.proc.kill()
    supervised.proc.wait(10)
    wait_until(lambda: _gone(child_pid), timeout=10)


def test_a_module_can_be_run_with_dash_m(tmp_path: Path) -> None:
    (tmp_path / "mymod.py").write_text("import sys\nprint('module', sys.argv[1:])\n")
    supervised = Supervised(
        tmp_path,
        ["--", "-m", "mymod", "a"],
        {**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert supervised.finish() == 0
    assert supervised.lines == ["[rank 0] module ['a']"]


def test_no_script_prints_usage_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "air_sdk.runtime.supervise"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_the_supervisor_starts_light_and_keeps_the_schema_line_limit():
    import subprocess
    import sys

    from air_sdk.runtime import supervise
    from air_sdk.schema.events import MAX_LOG_LINE_CHARS

    assert supervise.MAX_LOG_LINE_CHARS == MAX_LOG_LINE_CHARS
    code = (
        "import sys, air_sdk.runtime.supervise\n"
        "print([m for m in ('pydantic', 'requests', 'tenacity', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_gpu_jobs_rank_runs_with_the_flight_recorder_on(tmp_path: Path) -> None:
    (tmp_path / "show.py").write_text(
        "import os\n"
        "for k in ('TORCH_NCCL_TRACE_BUFFER_SIZE', 'TORCH_NCCL_DEBUG_INFO_PIPE_FILE',"
        " 'TORCH_NCCL_DUMP_ON_TIMEOUT', 'TORCH_FR_BUFFER_SIZE'):\n"
        "    print(k, os.environ.get(k))\n"
    )
    attempt = tmp_path / "attempt"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "AIR_FLIGHT_RECORDER": "1",
        "AIR_ATTEMPT_DIR": str(attempt),
        "TORCH_FR_BUFFER_SIZE": "50",  # the job's own choice wins
    }
    supervised = Supervised(tmp_path, ["show.py"], env)
    assert supervised.finish() == 0
    assert supervised.lines == [
        "[rank 0] TORCH_NCCL_TRACE_BUFFER_SIZE 2000",
        f"[rank 0] TORCH_NCCL_DEBUG_INFO_PIPE_FILE {attempt}/flight-recorder/rank_",
        "[rank 0] TORCH_NCCL_DUMP_ON_TIMEOUT 1",
        "[rank 0] TORCH_FR_BUFFER_SIZE 50",
    ]
    assert (attempt / "flight-recorder").is_dir()


def test_the_device_sample_interval_is_the_jobs_to_choose(capsys):
    from air_sdk.runtime import supervise
    from air_sdk.runtime._sampler import DEFAULT_INTERVAL_S

    assert supervise.sample_interval_s({}) == DEFAULT_INTERVAL_S
    assert supervise.sample_interval_s({"AIR_SAMPLE_INTERVAL_S": "0"}) == 0  # off
    assert supervise.sample_interval_s({"AIR_SAMPLE_INTERVAL_S": "0.1"}) == 0.1
    assert supervise.sample_interval_s({"AIR_SAMPLE_INTERVAL_S": "often"}) == DEFAULT_INTERVAL_S
    assert "ignoring AIR_SAMPLE_INTERVAL_S='often'" in capsys.readouterr().err
