"""`--checkpoint-dir` on `air submit` and `%%air train`, through a real gateway: a job
submitted with the CLI checkpoints into the directory named, and a notebook cell with the
same flag resumes from it under another layout (2 ranks, then 1), with no SDK call."""

from __future__ import annotations

import json
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

from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

TRAIN = """
import sys
import torch
import torch.nn.functional as F
import air_sdk.runtime as air

ctx = air.init()
total = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 6
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optim = torch.optim.SGD(model.parameters(), lr=0.1)
state = {"model": model, "optim": optim}
start = air.checkpoint.load(state) or 0
print(f"rank {ctx.rank} of {ctx.world_size} resumes after step {start}", flush=True)
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(ctx.rank))
for step in range(start + 1, total + 1):
    optim.zero_grad()
    loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    loss.backward()
    optim.step()
    air.log(step=step, loss=loss.item(), resumed_after=float(start))
air.checkpoint.save(state, step=total, block=True)
del model, optim, state
air.shutdown()
"""


def air_cli(gateway_process, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIR_GATEWAY_URL": gateway_process.url, "AIR_TOKEN": gateway_process.token}
    env.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [sys.executable, "-m", "air_sdk.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def notebook(
    gateway_process, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[InteractiveShell]:
    monkeypatch.setenv("AIR_TOKEN", gateway_process.token)
    cell_dir = tmp_path / "notebook"
    cell_dir.mkdir()
    monkeypatch.chdir(cell_dir)  # the working directory travels with the cell
    shell = start_ipython() or get_ipython()
    assert shell is not None
    before = set(shell.user_ns)
    shell.run_line_magic("load_ext", "air_sdk")
    yield shell
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]


def test_submit_and_a_cell_share_a_checkpoint_dir_across_layouts(
    gateway_process, notebook, tmp_path
):
    checkpoints = tmp_path / "shared-checkpoints"
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(TRAIN))
    run = air_cli(
        gateway_process,
        "submit",
        "train.py",
        "--nodes",
        "2",
        "--name",
        "ckpt-dir-cli",
        "--checkpoint-dir",
        str(checkpoints),
        "--follow",
        "--",
        "--steps",
        "4",
        cwd=src,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    first_id = run.stdout.split()[0]
    status = json.loads(air_cli(gateway_process, "status", first_id, "--json", cwd=src).stdout)
    assert status["state"] == "SUCCEEDED"
    assert status["spec"]["checkpoint"]["dir"] == str(checkpoints)
    assert (checkpoints / "step-4" / "manifest.json").exists()  # in the directory named

    result = notebook.run_cell(
        f"%%air train --nodes 1 --name ckpt-dir-cell --checkpoint-dir {checkpoints} --wait"
        f" --gateway {gateway_process.url}\n{textwrap.dedent(TRAIN)}"
    )
    assert result.success, result.error_in_exec or result.error_before_exec
    job = notebook.user_ns["_air_job"]
    record = job.record()
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())
    assert record.spec.checkpoint.dir == str(checkpoints)
    assert record.spec.resources.world_size == 1  # the first job ran on 2
    lines = [line.text for line in job.logs()]
    assert "rank 0 of 1 resumes after step 4" in lines, lines
    rows = job.metrics(name="loss")
    assert [row.step for row in rows] == [5, 6]
    assert (checkpoints / "step-6" / "manifest.json").exists()
