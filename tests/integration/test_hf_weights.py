"""Hugging Face weights in and out of any layout, on real gloo ranks and real
`transformers` models (Llama, Mistral: GQA, untied; Qwen2: GQA, tied embeddings, q/k/v
biases), built from tiny configs and saved with `save_pretrained`:

* `air.load_pretrained` fills a TP(2) x FSDP(2) model and a PP(2) x FSDP(2) pipeline
  (built on the meta device: no initial value exists to lean on) straight from the
  safetensors directory, and their logits equal the unsharded model's;
* fine-tuning from the loaded weights (SGD, 3 steps) logs the losses of one process;
* `air.save_pretrained` from the job, and `air checkpoints export --format hf` of the
  job's DCP checkpoint, both write a directory `from_pretrained` loads, with the
  trained weights of the one-process run.

Tolerance: fp32 throughout. Measured here: the TP(2) x FSDP(2) logits differ from one
process's by at most 2.1e-7 (Llama, Mistral; 1.8e-7 Qwen2), the pipeline's by 0; the
losses by at most 4.8e-7 and the trained weights by 1.2e-8. TP splits each
projection's sum over two ranks and adds the halves (the row-wise all-reduce), FSDP
reduce-scatters gradients over two ranks, the pipeline averages two microbatches'
gradients: the same numbers summed in another order, a few float32 ulps at logits
near 1 and losses near 4.5. `atol=1e-5` leaves 20x room for other CPUs' math
libraries and stays far below what a misplaced shard or a position that restarts at
0 on a sequence shard does to a logit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from airtest import torchrun_ranks

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

ATOL = 1e-5
STEPS, BATCH, SEQ, LR = 3, 4, 12, 0.1

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
}
#: layout -> AIR_PARALLELISM of 4 ranks, and the families it runs (a pipeline refuses
#: tied embeddings: its first and last stages would each hold a copy)
LAYOUTS = {
    "tp2xfsdp2": ({"dp_shard": 2, "tp": 2}, ("llama", "mistral", "qwen2")),
    "pp2xfsdp2": ({"dp_shard": 2, "pp": 2}, ("llama", "mistral")),
}

TRAIN = """
import json, os, sys
import torch
import torch.nn.functional as F
import air_sdk.runtime as air
from transformers import AutoConfig, AutoModelForCausalLM

root, layout, sizes, families = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
os.environ["AIR_PARALLELISM"] = sizes
STEPS, BATCH, SEQ, LR = {STEPS}, {BATCH}, {SEQ}, {LR}
ctx = air.init(timeout_s=120)
torch.set_num_threads(1)
is_pp = json.loads(sizes).get("pp", 1) > 1


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


for family in families:
    src = os.path.join(root, family)
    config = AutoConfig.from_pretrained(src)
    with torch.device("meta"):  # no initial values: every number comes from the file
        model = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1), generator=g)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    dp = air.submesh("dp")
    per = BATCH // dp.size()
    rows = slice(dp.get_local_rank() * per, (dp.get_local_rank() + 1) * per)
    if is_pp:
        pipe = air.pipeline(model, microbatches=2, loss_fn=loss_fn, schedule="GPipe")
        loaded = air.load_pretrained(pipe, src)
        losses = [] if pipe.is_last else None
        # schedule.eval() before the first step would set the stages up forward-only
        # for good (torch 2.13), and the first step fixes the microbatch shapes: take
        # the logits of a training step on this rank's rows, then drop its gradients
        args = (inputs[rows],) if pipe.is_first else ()
        target = targets[rows] if pipe.is_last else None
        logits = pipe.schedule.step(*args, target=target, losses=losses, return_outputs=True)
        params = list(pipe.parameters())
        for p in params:
            p.grad = None
    else:
        model = air.parallelize(model)
        loaded = air.load_pretrained(model, src)
        with torch.no_grad():
            logits = model(inputs).logits
        params = list(model.parameters())
    if logits is not None and ctx.rank in (0, 3):
        part = (rows.start, rows.stop) if is_pp else (0, BATCH)
        torch.save((part, logits.detach()), os.path.join(root, f"{{layout}}-{{family}}-logits-{{ctx.rank}}.pt"))
    optimizer = torch.optim.SGD(params, lr=LR)
    for step in range(1, STEPS + 1):
        if is_pp:
            loss = pipe.step(inputs[rows], targets[rows])
        else:
            loss = loss_fn(model(inputs[rows]).logits, targets[rows])
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = air.dp_mean(loss)  # a collective: on every rank
        air.log(step=step, loss=mean)
        if ctx.rank == 0:
            with open(os.path.join(root, f"{{layout}}-{{family}}-losses.jsonl"), "a") as f:
                f.write(json.dumps(float(mean)) + "\\n")
    out = os.path.join(root, f"{{layout}}-{{family}}-saved")
    air.save_pretrained(pipe if is_pp else model, out, config_from=src)
    air.checkpoint.configure(os.path.join(root, f"{{layout}}-{{family}}-ckpt"))
    state = {{"model": pipe.model_parts if is_pp else model}}
    air.checkpoint.save(state, step=STEPS, block=True)
    print(f"rank {{ctx.rank}} {{family}}: loaded {{loaded.num_tensors}} tied {{loaded.tied}}", flush=True)
    del model
air.shutdown()
"""


def _tiny(family: str, tmp: Path) -> Path:
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        vocab_size=96,
        max_position_embeddings=64,
        **extra,
    )
    torch.manual_seed(11 + list(FAMILIES).index(family))
    model = getattr(transformers, model_name)(config)
    if family == "qwen2":  # biases of zero would hide a wrongly sharded bias
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.2)
    out = tmp / family
    model.save_pretrained(out)
    return out


def _reference(directory: Path) -> tuple[Any, list[float], dict[str, Any]]:
    """(logits of the loaded model, losses of 3 SGD steps on the whole batch, the
    trained state) in this one process."""
    import torch.nn.functional as F

    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    g = torch.Generator().manual_seed(5)
    config = model.config
    tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1), generator=g)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        logits = model(inputs).logits
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        out = model(inputs).logits
        loss = F.cross_entropy(out.float().flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return logits, losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    for family in FAMILIES:
        _tiny(family, root)
    return root


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_hf_weights_load_train_and_export_in_a_layout(checkpoints: Path, layout: str) -> None:
    sizes, families = LAYOUTS[layout]
    script = checkpoints / "train_hf.py"
    script.write_text(textwrap.dedent(TRAIN).format(STEPS=STEPS, BATCH=BATCH, SEQ=SEQ, LR=LR))
    logs = torchrun_ranks(
        4, script, str(checkpoints), layout, json.dumps(sizes), ",".join(families),
        timeout_s=600,
    )  # fmt: skip
    for family in families:
        assert f"rank 0 {family}: loaded" in logs
        logits, losses, trained = _reference(checkpoints / family)
        holders = (0,) if layout.startswith("tp") else (3,)  # the last stage has the logits
        for rank in holders:
            (start, stop), got = torch.load(checkpoints / f"{layout}-{family}-logits-{rank}.pt")
            want = logits[start:stop]
            diff = (got - want).abs().max().item()
            print(f"{layout} {family}: max logit diff {diff:.3g}")
            assert got.shape == want.shape
            assert diff <= ATOL, (family, diff)
        lines = (checkpoints / f"{layout}-{family}-losses.jsonl").read_text().split()
        logged = [json.loads(line) for line in lines]
        assert logged == pytest.approx(losses, abs=ATOL), family
        assert losses[-1] < losses[0] - 0.1  # it trains, not just agrees
        saved = transformers.AutoModelForCausalLM.from_pretrained(
            checkpoints / f"{layout}-{family}-saved"
        )
        _assert_weights(saved.state_dict(), trained, family)
        exported = checkpoints / f"{layout}-{family}-exported"
        done = subprocess.run(
            [str(Path(sys.executable).parent / "air"), "checkpoints", "export",
             str(checkpoints / f"{layout}-{family}-ckpt"), "--to", str(exported),
             "--format", "hf", "--config", str(checkpoints / family)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        back = transformers.AutoModelForCausalLM.from_pretrained(exported)
        _assert_weights(back.state_dict(), trained, family)


def _assert_weights(got: dict[str, Any], want: dict[str, Any], family: str) -> None:
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())
    for name, tensor in want.items():
        assert torch.allclose(got[name], tensor, atol=ATOL, rtol=0), (family, name)
