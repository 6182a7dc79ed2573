"""Tied embeddings under a pipeline: `Qwen2ForCausalLM` with `tie_word_embeddings=True`
on two gloo ranks, PP(2).

AIR does not sum a tied parameter's gradients across the first and the last stage,
so `air.pipeline` refuses the tie with the line that unties it. This test runs that
line, word for word from the refusal, on a model built on the meta device, then
`air.pipeline` + `air.load_pretrained` from the tied checkpoint (which holds no
`lm_head.weight`: the head is filled from the embedding) and 3 SGD steps. The losses
equal those of one process that loads the same checkpoint with `from_pretrained`,
unties it by the same line and trains alike; the first equals the tied model's
first loss (same numbers), later ones differ from the tied model's (the head no
longer takes the embedding's gradients), which the test shows too.

Tolerance: fp32, as in test_hf_weights.py (pipeline logits equal one process's
exactly there; the microbatch average sums in another order): 1e-5.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from airtest import torchrun_ranks

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

ATOL = 1e-5
STEPS, BATCH, SEQ, LR = 3, 4, 12, 0.1

JOB = """
import json, os, sys
import torch
import torch.nn.functional as F
import air_sdk.runtime as air
from air_sdk.errors import ConfigError
from transformers import AutoConfig, AutoModelForCausalLM

src, out = sys.argv[1], sys.argv[2]
STEPS, BATCH, SEQ, LR = {STEPS}, {BATCH}, {SEQ}, {LR}
ctx = air.init(timeout_s=120)
torch.set_num_threads(1)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


config = AutoConfig.from_pretrained(src)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config)
try:
    air.pipeline(model, microbatches=2, loss_fn=loss_fn, schedule="GPipe")
    raise SystemExit("the tied model was not refused")
except ConfigError as exc:
    refusal = str(exc)
untie = refusal.split("Untie it before air.pipeline: ", 1)[1].split(". The head", 1)[0]
exec(untie)
pipe = air.pipeline(model, microbatches=2, loss_fn=loss_fn, schedule="GPipe")
loaded = air.load_pretrained(pipe, src)
g = torch.Generator().manual_seed(5)
tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1), generator=g)
optimizer = torch.optim.SGD(pipe.parameters(), lr=LR)
losses = []
for step in range(STEPS):
    loss = pipe.step(tokens[:, :-1], tokens[:, 1:])
    optimizer.step()
    optimizer.zero_grad()
    losses.append(float(loss))
with open(f"{{out}}.{{ctx.rank}}", "w") as f:
    json.dump({{"refusal": refusal, "untie": untie, "losses": losses,
               "tied": list(loaded.tied)}}, f)
del model, pipe
air.shutdown()
"""


def _one_process(src: Path, untie: str | None) -> list[float]:
    import torch.nn.functional as F

    model = transformers.AutoModelForCausalLM.from_pretrained(src)
    if untie is not None:
        exec(untie, {"model": model, "torch": torch})
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, model.config.vocab_size, (BATCH, SEQ + 1), generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        logits = model(tokens[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_tied_qwen2_is_refused_with_a_line_that_unties_it_and_then_matches_one_process(
    tmp_path: Path,
) -> None:
    config = transformers.Qwen2Config(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(13)
    src = tmp_path / "qwen2"
    transformers.Qwen2ForCausalLM(config).save_pretrained(src)
    from safetensors import safe_open

    with safe_open(src / "model.safetensors", framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # noqa: SIM118  (a tied checkpoint)
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB).format(STEPS=STEPS, BATCH=BATCH, SEQ=SEQ, LR=LR))
    out = tmp_path / "result.json"
    torchrun_ranks(2, script, str(src), str(out), timeout_s=600, AIR_PARALLELISM='{"pp": 2}')
    result, last = (json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1))
    assert re.search(
        r"'model.embed_tokens.weight' and 'lm_head.weight' are one tied", result["refusal"]
    )
    assert result["untie"].endswith("model.config.tie_word_embeddings = False")
    # the last stage's head, filled from the file's embedding
    assert (result["tied"], last["tied"]) == ([], ["lm_head.weight"])
    assert last["losses"] == result["losses"]  # broadcast over the pp group

    untied = _one_process(src, result["untie"])
    tied = _one_process(src, None)
    assert result["losses"] == pytest.approx(untied, abs=ATOL)
    assert result["losses"][0] == pytest.approx(tied[0], abs=ATOL)
    assert abs(result["losses"][-1] - tied[-1]) > 10 * ATOL  # untied trains otherwise
    assert untied[-1] < untied[0] - 0.1  # it trains
