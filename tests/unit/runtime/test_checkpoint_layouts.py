"""A checkpoint saved under one parallel layout resumes under another, on real gloo ranks,
and training goes on with the losses of an uninterrupted run:

* 4 ranks: FSDP(4) trains steps 1-6 straight (the reference) and saves step 3; TP(2) x
  FSDP(2) and PP(2) x FSDP(2) (GPipe, each stage holding its layers under the full
  model's names) each resume step 3 and train 4-6; the pipeline run saves step 5.
* 2 ranks: FSDP(2) resumes FSDP(4)'s step 3, and the pipeline's step 5 (another pp
  size, another world size).
* the FSDP(4) and pipeline checkpoints export to safetensors files that load into the
  plain model with the full parameters of those steps.

Tolerance: fp32 throughout. Another layout sums the same numbers in another order (a
reduce-scatter over 2 ranks instead of 4, TP's row-parallel partial sums, microbatches),
so losses agree to rounding: here they differ by at most 1.2e-7, relative; `rtol=1e-5`
leaves room for that and still catches a wrong resume: restoring the model but not
AdamW's moments changes step 5's loss by 1.3% here, and a shard loaded into the wrong
place changes step 4's by far more.
"""

from __future__ import annotations

import json
import runpy
import textwrap
from pathlib import Path
from typing import Any

import pytest
from airtest import torchrun_ranks

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from air_sdk.runtime.checkpoint.export import export_safetensors  # noqa: E402

pytestmark = pytest.mark.slow

RTOL, ATOL = 1e-5, 1e-6

MODEL = '''
import torch
import torch.nn as nn

DIN, D, H, DOUT, BATCH, STEPS = 6, 16, 32, 3, 8, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x):
        return x + self.w2(torch.tanh(self.w1(x)))


class Net(nn.Module):
    """Pipeline stages are copies with the other stages' modules removed: the names stay."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(DIN, D)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(2)})
        self.out = nn.Linear(D, DOUT)

    def forward(self, x):
        if self.inp is not None:
            x = self.inp(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.out(x) if self.out is not None else x


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, DIN, generator=g), torch.randn(BATCH, DOUT, generator=g)
'''

TRAIN = '''
import json, os, sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import air_sdk.runtime as air
from model import BATCH, STEPS, Net, batch

SIZES = {"fsdp": {}, "tp_fsdp": {"tp": 2}, "pp_fsdp": {"pp": 2}}


def build(layout):
    """The model under `layout`; (model parts, optimizers, mesh, data-parallel mesh)."""
    world = dist.get_world_size()
    sizes = {"dp_shard": world // max(SIZES[layout].values(), default=1), **SIZES[layout]}
    os.environ["AIR_PARALLELISM"] = json.dumps(sizes)  # as AIR's runner passes a job's layout
    torch.manual_seed(7)  # other weights than the reference's: the checkpoint must win
    model = Net()
    if layout == "fsdp":
        mesh = dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    elif layout == "tp_fsdp":
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp_shard", "tp"))
        for block in model.layers.values():
            plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
            parallelize_module(block, mesh["tp"], plan)
        dp = mesh["dp_shard"]
    else:
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", "dp_shard"))
        dp = mesh["dp_shard"]
        if mesh["pp"].get_local_rank() == 0:
            model.out = None
            del model.layers["1"]
        else:
            model.inp = None
            del model.layers["0"]
    for block in model.layers.values():
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), mesh, dp


def run(layout, resume, saves, out):
    model, optim, mesh, dp = build(layout)
    if layout == "pp_fsdp":  # this rank's model parts, one optimizer per part
        state = {"model": [model], "optim": [optim]}
    else:
        state = {"model": model, "optim": optim}
    start = air.checkpoint.load(state, step=resume) if resume else 0
    assert start == resume, (start, resume)
    per, lo = BATCH // dp.size(), BATCH // dp.size() * dp.get_local_rank()
    last_stage = True
    if layout == "pp_fsdp":
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        index = mesh["pp"].get_local_rank()
        stage = PipelineStage(model, index, 2, torch.device("cpu"), group=mesh["pp"].get_group())
        schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
        last_stage = index == 1
    losses = {}
    for step in range(start + 1, STEPS + 1):
        x, y = (t[lo : lo + per] for t in batch(step))
        optim.zero_grad()
        if layout != "pp_fsdp":
            loss = F.mse_loss(model(x), y)
            loss.backward()
        elif last_stage:
            micro = []
            schedule.step(target=y, losses=micro)
            loss = torch.stack(micro).mean()
        else:
            schedule.step(x)
        optim.step()
        if last_stage:  # the mean over the data-parallel ranks: the whole batch's loss
            total = loss.detach().clone()
            dist.all_reduce(total, group=dp.get_group())
            losses[step] = total.item() / dp.size()
        if step in saves:
            air.checkpoint.save(state, step=step, block=True)
            params = {k: v.full_tensor() for k, v in model.state_dict().items()}  # collective
            if dp.get_local_rank() == 0:
                torch.save(params, f"{out}/{layout}-step{step}-rank{dist.get_rank()}.pt")
    name = f"{layout}-from{resume}-world{dist.get_world_size()}"
    if last_stage and dp.get_local_rank() == 0:
        with open(f"{out}/{name}.json", "w") as f:
            json.dump(losses, f)


air.init(timeout_s=120)
directory, out, phases = sys.argv[1], sys.argv[2], sys.argv[3:]
air.checkpoint.configure(directory, keep=10)
for phase in phases:  # LAYOUT:RESUME:SAVES, e.g. pp_fsdp:3:5
    layout, resume, saves = phase.split(":")
    run(layout, int(resume), {int(s) for s in saves.split(",") if s}, out)
air.shutdown()
'''


def losses(out: Path, name: str) -> dict[int, float]:
    return {int(k): v for k, v in json.loads((out / f"{name}.json").read_text()).items()}


def close(got: dict[int, float], want: dict[int, float]) -> bool:
    return got.keys() <= want.keys() and all(
        abs(v - want[k]) <= ATOL + RTOL * abs(want[k]) for k, v in got.items()
    )


def gathered(out: Path, pattern: str) -> dict[str, Any]:
    """The full parameters a run wrote, merged over the files of its pipeline stages."""
    merged: dict[str, Any] = {}
    for path in sorted(out.glob(pattern)):
        merged.update(torch.load(path, weights_only=True))
    return merged


def test_a_checkpoint_resumes_under_other_layouts_and_world_sizes_with_the_same_losses(
    tmp_path: Path,
) -> None:
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL))
    Net = runpy.run_path(str(tmp_path / "model.py"))["Net"]
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    four = torchrun_ranks(
        4,
        tmp_path / "train.py",
        str(ckpt),
        str(out),
        "fsdp:0:3",
        "tp_fsdp:3:",
        "pp_fsdp:3:5",
        timeout_s=400,
    )
    two = torchrun_ranks(
        2, tmp_path / "train.py", str(ckpt), str(out), "fsdp:3:", "fsdp:5:", timeout_s=300
    )

    reference = losses(out, "fsdp-from0-world4")
    assert sorted(reference) == [1, 2, 3, 4, 5, 6]
    for name in (
        "tp_fsdp-from3-world4",
        "pp_fsdp-from3-world4",
        "fsdp-from3-world2",
        "fsdp-from5-world2",
    ):
        got = losses(out, name)
        assert got and close(got, reference), (name, got, reference)
    assert sorted(losses(out, "pp_fsdp-from3-world4")) == [4, 5, 6]

    assert "saved under dp_shard=4 (4 ranks), resharded to dp_shard=2 x tp=2 (4 ranks)" in four
    assert "saved under dp_shard=4 (4 ranks), resharded to pp=2 x dp_shard=2 (4 ranks)" in four
    assert "saved under dp_shard=4 (4 ranks), resharded to dp_shard=2 (2 ranks)" in two
    assert "saved under pp=2 x dp_shard=2 (4 ranks), resharded to dp_shard=2 (2 ranks)" in two
    manifest = json.loads((ckpt / "step-5" / "manifest.json").read_text())
    assert manifest["parallelism"]["pp"] == 2 and manifest["world_size"] == 4

    # FSDP(4)'s shards and the pipeline's stages, each as one file of full tensors
    for step, pattern in ((3, "fsdp-step3-rank*.pt"), (5, "pp_fsdp-step5-rank*.pt")):
        export_safetensors(ckpt, tmp_path / f"step{step}.safetensors", step=step)
        exported = safetensors_torch.load_file(tmp_path / f"step{step}.safetensors")
        expected = gathered(out, pattern)
        assert exported.keys() == expected.keys()
        assert all(torch.equal(exported[k], expected[k]) for k in expected)
        Net().load_state_dict(exported, strict=True)  # the plain, un-parallelized model
