"""`%%air train` end to end: notebook cells in an IPython shell, a real gateway, two gloo
ranks on two virtual nodes. The model class and the helper come from earlier cells."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython import get_ipython
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

from air_sdk.errors import JobFailedError
from air_sdk.gateway.server import GatewayProcess
from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

MODEL_CELL = """
import torch
from torch import nn

class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)
"""

HELPER_CELL = """
def make_batch(rank, n=16):
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(n, 4, generator=generator)
    return x, x.sum(dim=1, keepdim=True) * SCALE

SCALE = 0.5
"""

TRAIN_CELL = """
import torch.distributed as dist
import air_sdk.runtime as air

ctx = air.init()
torch.manual_seed(0)
model = TinyNet()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 11):
    x, y = make_batch(ctx.rank)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():  # data parallel by hand: average the gradients
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size
    opt.step()
    ranks = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(ranks)
    air.log(step=step, loss=loss.item(), rank_sum=ranks.item())
print(f"cell done on rank {ctx.rank} of {ctx.world_size}", flush=True)
del model, opt
air.shutdown()
"""


@pytest.fixture
def notebook(
    gateway_process: GatewayProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[InteractiveShell]:
    monkeypatch.setenv("AIR_TOKEN", gateway_process.token)
    monkeypatch.chdir(tmp_path)  # the working directory travels with the cell
    shell = start_ipython() or get_ipython()
    assert shell is not None
    before = set(shell.user_ns)
    shell.run_line_magic("load_ext", "air_sdk")
    yield shell
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]


def run(shell: InteractiveShell, source: str) -> None:
    result = shell.run_cell(textwrap.dedent(source))
    assert result.success, result.error_in_exec or result.error_before_exec


def test_a_cell_trains_on_two_ranks_with_what_earlier_cells_defined(notebook, gateway_process):
    run(notebook, MODEL_CELL)
    run(notebook, HELPER_CELL)

    run(
        notebook,
        f"%%air train --nodes 2 --name cell-ddp --wait --gateway {gateway_process.url}\n{TRAIN_CELL}",
    )

    job = notebook.user_ns["_air_job"]
    record = job.record()
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())
    assert record.spec.resources.world_size == 2
    lines = [line.text for line in job.logs()]
    assert "cell done on rank 0 of 2" in lines and "cell done on rank 1 of 2" in lines
    rows = job.metrics()
    assert {row.rank for row in rows} == {0, 1}
    assert sorted(row.step for row in rows if row.rank == 0) == list(range(1, 11))
    assert all(row.values["rank_sum"] == 3.0 for row in rows)  # 1 + 2: a real all_reduce
    rank0 = [row.values["loss"] for row in rows if row.rank == 0]
    assert rank0[-1] < rank0[0]


def test_a_failing_cell_fails_the_job_with_the_cells_own_line(notebook, gateway_process):
    cell = "import air_sdk.runtime as air\nlr = 0.1\nraise RuntimeError(f'diverged at lr={lr}')\n"
    result = notebook.run_cell(f"%%air train --wait --gateway {gateway_process.url}\n{cell}")

    assert isinstance(result.error_in_exec, JobFailedError)
    job = notebook.user_ns["_air_job"]
    assert job.status() is JobState.FAILED
    lines = [line.text for line in job.logs()]
    assert '  File "<air cell>", line 3, in <module>' in lines, lines
    assert "RuntimeError: diverged at lr=0.1" in lines
