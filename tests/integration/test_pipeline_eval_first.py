"""`Pipeline.eval_step` before the first `step` leaves a pp=2 pipeline training as one
that never evaluated: the open question an earlier branch raised ("schedule.eval() before
the first step() leaves the stages forward-only in torch 2.13").

It did not reproduce: torch 2.13's schedules record whether the stages were set up with
a backward pass and set them up again when a `step` follows an `eval` (the eval/train
switch in `_PipelineSchedule._initialize_pp_stages`). This test keeps it so: on 2 real
gloo ranks (pp=2, the tiny Llama of `air_sdk.examples.llama`), under GPipe and 1F1B, a
pipeline that ran `eval_step` first must give every parameter of both stages the same
gradient, bit for bit, as a fresh one, and log the same loss. A stage left forward-only
shows here as parameters without a gradient (the first stage gets none back).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from airtest import torchrun_ranks

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCHEDULES = ("GPipe", "1F1B")

EVAL_FIRST = """
import json, os, sys
import torch
import air_sdk.runtime as air
from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn, synthetic_batch

os.environ["AIR_PARALLELISM"] = json.dumps({"pp": 2, "dp_shard": 1})
out, schedules = sys.argv[1], sys.argv[2].split(",")
ctx = air.init(timeout_s=120)
torch.set_num_threads(1)
config = LlamaConfig(n_layers=2, n_kv_heads=2)
tokens, targets = synthetic_batch(config, batch_size=4, seq_len=16, step=0)


def train_step(evaluate_first):
    torch.manual_seed(0)
    pipe = air.pipeline(build_llama(config), microbatches=2, loss_fn=loss_fn, schedule=schedule)
    evaluated = float(pipe.eval_step(tokens, targets)) if evaluate_first else None
    loss = float(pipe.step(tokens, targets))
    grads = {n: p.grad for part in pipe.model_parts for n, p in part.named_parameters()}
    return evaluated, loss, grads


found = {}
for schedule in schedules:
    _, fresh_loss, fresh = train_step(evaluate_first=False)
    evaluated, loss, grads = train_step(evaluate_first=True)
    found[schedule] = {
        "params": len(grads),
        "without_grad": sorted(n for n, g in grads.items() if g is None),
        "differ": sorted(
            n for n, g in grads.items()
            if g is not None and (fresh[n] is None or not torch.equal(g, fresh[n]))
        ),
        "eval_loss": evaluated,
        "loss": loss,
        "fresh_loss": fresh_loss,
    }
with open(os.path.join(out, f"rank-{ctx.rank}.json"), "w") as f:
    json.dump(found, f)
air.shutdown()
"""


def test_eval_step_before_the_first_step_leaves_a_pipeline_training(tmp_path: Path) -> None:
    script = tmp_path / "eval_first.py"
    script.write_text(textwrap.dedent(EVAL_FIRST))
    torchrun_ranks(2, script, str(tmp_path), ",".join(SCHEDULES), timeout_s=300)
    for rank in (0, 1):  # rank 0 holds the first stage, rank 1 the last
        found = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        for schedule in SCHEDULES:
            got = found[schedule]
            assert got["params"] > 0, (rank, schedule)
            assert not got["without_grad"], f"rank {rank} {schedule}: left forward-only: {got}"
            assert not got["differ"], f"rank {rank} {schedule}: other gradients: {got}"
            # the weights have not moved before the step: eval sees the training loss
            assert got["eval_loss"] == pytest.approx(got["fresh_loss"], abs=1e-6), got
            assert got["loss"] == got["fresh_loss"], got
