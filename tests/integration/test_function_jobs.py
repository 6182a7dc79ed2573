"""`@air_sdk.distributed` end to end: a real gateway, gloo ranks on two virtual nodes.
A script gets rank 0's return value; a notebook gets a rank's exception with its
traceback; `.submit()` returns the job at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython import get_ipython
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

from air_sdk.client import Job
from air_sdk.errors import JobFailedError
from air_sdk.gateway.server import GatewayProcess
from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

SCRIPT = """
import air_sdk

SCALE = 3


class Summary:
    def __init__(self, world, total):
        self.world, self.total = world, total


def helper(x):
    return x * SCALE


@air_sdk.distributed(nodes=2, name="fn-script")
def train(base, *, extra=0):
    import torch
    import torch.distributed as dist

    import air_sdk.runtime as air

    ctx = air.init()
    ranks = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(ranks)  # 1 + 2 on every rank: a real collective
    print(f"hello from rank {ctx.rank}", flush=True)
    summary = Summary(ctx.world_size, helper(ranks.item()) + base + extra)
    air.shutdown()
    return summary if ctx.rank == 0 else "not rank 0"


if __name__ == "__main__":
    value = train(10, extra=1)
    print("RESULT", type(value).__name__, value.world, value.total, isinstance(value, Summary))
"""


def test_a_script_gets_rank_0s_return_value_from_a_two_node_job(gateway_process, tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    env = {
        **os.environ,
        "AIR_GATEWAY_URL": gateway_process.url,
        "AIR_TOKEN": gateway_process.token,
    }
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,  # the working directory is the job's code
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # a class of the script comes back as itself; 3 * (1 + 2) + 10 + 1
    assert lines[-1] == "RESULT Summary 2 20.0 True", done.stdout
    assert "[rank 0] hello from rank 0" in lines and "[rank 1] hello from rank 1" in lines


HELPER_CELL = """
def check(lr):
    if lr > 0.1:
        raise ValueError(f"lr {lr} diverges")
"""

FUNCTION_CELL = """
import air_sdk

@air_sdk.distributed(nodes=2, show_logs=False)
def train(lr):
    import air_sdk.runtime as air
    ctx = air.init()
    if ctx.rank == 1:
        check(lr)
    air.shutdown()
    return ctx.world_size
"""


@pytest.fixture
def notebook(
    gateway_process: GatewayProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[InteractiveShell]:
    monkeypatch.setenv("AIR_GATEWAY_URL", gateway_process.url)
    monkeypatch.setenv("AIR_TOKEN", gateway_process.token)
    monkeypatch.chdir(tmp_path)
    shell = start_ipython() or get_ipython()
    assert shell is not None
    before = set(shell.user_ns)
    yield shell
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]


def run(shell: InteractiveShell, source: str) -> None:
    result = shell.run_cell(textwrap.dedent(source))
    assert result.success, result.error_in_exec or result.error_before_exec


def test_a_rank_that_raises_fails_the_call_with_its_notebook_traceback(notebook, capsys):
    run(notebook, HELPER_CELL)
    run(notebook, FUNCTION_CELL)
    capsys.readouterr()

    result = notebook.run_cell("train(0.5)")

    error = result.error_in_exec
    assert isinstance(error, JobFailedError), error
    assert error.reason == "rank 1 raised ValueError: lr 0.5 diverges"
    assert (error.rank, error.remote_type) == (1, "ValueError")
    tb = error.remote_traceback or ""
    # the frames of the notebook's cells, with their lines, and none of AIR's
    assert "in train\n    check(lr)\n" in tb
    assert 'in check\n    raise ValueError(f"lr {lr} diverges")\n' in tb
    assert "function_call.py" not in tb and "__air_main__" not in tb
    shown = capsys.readouterr().out  # what IPython printed: the remote traceback
    assert "Remote traceback on rank 1:" in shown
    assert 'raise ValueError(f"lr {lr} diverges")' in shown
    assert shown.rstrip().endswith(f"JobFailedError: job {error.job_id} failed: {error.reason}")
    assert "air_sdk/client" not in shown  # not the SDK's frames


def test_submit_returns_the_job_at_once_and_result_waits_for_rank_0(notebook):
    run(notebook, HELPER_CELL)
    run(notebook, FUNCTION_CELL)
    run(notebook, "job = train.submit(0.01)")

    job = notebook.user_ns["job"]
    assert isinstance(job, Job)
    assert not job.record().state.terminal  # it did not wait for the job
    assert job.result(timeout=240) == 2
    assert job.status() is JobState.SUCCEEDED
