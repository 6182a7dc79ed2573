"""Lightning, transformers and accelerate jobs in the monitor, in a real JupyterLab +
chromium: what autolog reports is what a user sees.

Each library trains a tiny model for 30 steps on 2 virtual nodes x 1 rank, logging
every step and checkpointing every 10, with no AIR code in the training loop.
Lightning and transformers run as `%%air train` cells; accelerate as a script written
with `%%writefile`, submitted with `air submit` and watched with `%air attach`. The test
waits for SUCCEEDED, then checks the page: the step line at the library's last
logged step, a chart, the library's own metric names in the chart menu with its loss
charted by default, and the three checkpoints the library wrote in the checkpoints
table (the chart draws them as triangles). The picture of each monitor goes to
docs/images/monitor-<library>.png with `AIR_UPDATE_SCREENSHOTS=1` (see conftest).

One gateway serves the module: the first notebook starts it, the others reuse it
(`%air gateway start` finds it in the same AIR_HOME), JupyterLab's teardown stops it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from airtest import no_processes_left, wait_for
from monitor_page import (
    CHART,
    CHECKPOINTS,
    METRIC_SELECT,
    METRICS,
    MONITOR,
    STEP,
    chart_src,
    metric_options,
    state_text,
    wait_state,
)

pytestmark = pytest.mark.slow

NUM_STEPS = 30
#: a job's 2 ranks import torch and the library on 2 cores: 10-25 s measured
JOB_TIMEOUT_S = 150
SETUP = "%load_ext air_sdk\n%air gateway start"
REPORT = 'print("submitted", _air_job.id)'

LIGHTNING = f"""\
%%air train --nodes 2 --name lightning --total-steps {NUM_STEPS}
import os

import lightning.pytorch as pl
import torch


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
x = torch.randn(480, 8)
y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.05 * torch.randn(480, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
out = os.environ.get("AIR_CHECKPOINT_DIR", "out")
save = pl.callbacks.ModelCheckpoint(
    dirpath=os.path.join(out, "ckpt"), every_n_train_steps=10, save_top_k=-1
)
trainer = pl.Trainer(
    strategy="ddp", num_nodes=2, devices=1, accelerator="cpu", max_steps={NUM_STEPS},
    log_every_n_steps=1, callbacks=[save], default_root_dir=out,
    enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Regression(), loader)"""

TRANSFORMERS = f"""\
%%air train --nodes 2 --name transformers --total-steps {NUM_STEPS}
import os

import torch
import transformers


class Pattern(torch.utils.data.Dataset):
    \"\"\"Rows that step through the vocabulary by 5: a causal LM learns them quickly.\"\"\"

    def __len__(self):
        return 480

    def __getitem__(self, i):
        ids = (i + 5 * torch.arange(16)) % 64
        return {{"input_ids": ids, "labels": ids}}


torch.manual_seed(0)
config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
args = transformers.TrainingArguments(
    output_dir=os.environ.get("AIR_CHECKPOINT_DIR", "out"), max_steps={NUM_STEPS},
    per_device_train_batch_size=8, learning_rate=5e-3, logging_steps=1, save_steps=10,
    report_to="none", use_cpu=True, ddp_backend="gloo", disable_tqdm=True,
)
trainer = transformers.Trainer(
    model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Pattern()
)
trainer.train()"""

ACCELERATE_SCRIPT = """\
%%writefile train_accelerate.py
import os

import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(480, 8)
y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.05 * torch.randn(480, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
out = os.environ.get("AIR_CHECKPOINT_DIR", "out")
for step, (xb, yb) in enumerate(loader, start=1):
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    accelerator.log({"loss": loss.item()}, step=step)
    if step % 10 == 0:
        accelerator.save_state(os.path.join(out, f"step_{step}"))
accelerator.end_training()"""

ACCELERATE_SUBMIT = f"""\
submitted = !air submit train_accelerate.py --nodes 2 --name accelerate
job_id = submitted[0]  # `air submit` prints the job id first
%air attach $job_id --total-steps {NUM_STEPS}"""


@dataclass(frozen=True)
class Case:
    cells: tuple[str, ...]
    #: metric names the library logs itself, each must be in the chart menu
    metrics: frozenset[str]
    #: the metric the chart shows first (the library's training loss)
    charted: str
    #: the checkpoint path of step N, as the table shows it
    checkpoint: str


CASES = {
    "lightning": Case(
        (LIGHTNING,),
        frozenset({"train_loss", "epoch"}),
        "train_loss",
        "ckpt/epoch=0-step={n}.ckpt",
    ),
    "transformers": Case(
        (TRANSFORMERS,),
        frozenset({"loss", "grad_norm", "learning_rate", "epoch", "train_runtime"}),
        "loss",
        "checkpoint-{n}",
    ),
    "accelerate": Case(
        (ACCELERATE_SCRIPT, ACCELERATE_SUBMIT), frozenset({"loss"}), "loss", "step_{n}"
    ),
}


def write_notebook(path: Path, cells: tuple[str, ...]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (SETUP, *cells, REPORT)]
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("library", list(CASES))
def test_a_library_job_in_the_monitor(
    library: str, open_notebook: Any, tmp_path: Path, screenshot: Any
) -> None:
    pytest.importorskip(
        library, reason=f"{library} comes with the dev extra (pip install -e '.[dev]')"
    )
    case = CASES[library]
    notebook = open_notebook(write_notebook(tmp_path / f"{library}.ipynb", case.cells))
    page = notebook.page

    # Every cell returns at once (the job runs in the gateway): run them all.
    notebook.run_from("%load_ext air_sdk")
    printed = re.search(r"submitted (\S+)", notebook.outputs_text())
    assert printed, notebook.text()
    job_id = printed.group(1)
    assert page.locator(MONITOR).count() == 1, notebook.text()
    assert job_id in state_text(notebook), (job_id, state_text(notebook))

    wait_state(notebook, "SUCCEEDED", timeout_s=JOB_TIMEOUT_S)
    # The final redraw follows the state: wait for the last step and checkpoint.
    last_checkpoint = case.checkpoint.format(n=NUM_STEPS)
    # The monitor counts steps: Lightning's loggers get 0-based steps (its CSVLogger's
    # rows read 0..29), and its last, 29, is its 30th, as the others' 30 is theirs.
    last_step = f"step {NUM_STEPS} / {NUM_STEPS} ("
    wait_for(
        lambda: (
            last_checkpoint in page.locator(CHECKPOINTS).inner_text()
            and last_step in page.locator(STEP).inner_text()
        ),
        timeout_s=15,
        what=f"{last_step!r} and {last_checkpoint} in the monitor",
    )

    # The chart: drawn, of the library's loss, with the library's metric names to pick.
    src = chart_src(notebook) or ""
    assert src.startswith("data:image/png") or src.startswith("blob:"), src[:80]
    assert page.locator(CHART).is_visible()
    options = metric_options(page)
    assert case.metrics <= set(options), (library, options)
    assert page.locator(METRIC_SELECT).input_value() == case.charted, options
    assert case.charted in page.locator(METRICS).inner_text()

    # The checkpoints the library wrote, every 10 steps, listed as the job's.
    table = page.locator(CHECKPOINTS).inner_text()
    assert "checkpoints (3)" in table, table
    for step in (10, 20, 30):
        assert case.checkpoint.format(n=step) in table, (step, table)

    screenshot(page.locator(MONITOR), f"monitor-{library}.png")
    assert no_processes_left(job_id)
