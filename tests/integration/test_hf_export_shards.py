"""`air checkpoints export --format hf --max-shard-size` splits the weights as
`transformers` does: a job loads a tiny Qwen2 (tied embeddings, q/k/v biases) with
`air.load_pretrained` on two FSDP gloo ranks and commits a DCP checkpoint; the export
of that checkpoint with a shard size far below the model's writes
`model-0000i-of-0000n.safetensors` files, none over the limit unless one tensor is,
and `model.safetensors.index.json` naming every tensor's file; and
`transformers.AutoModelForCausalLM.from_pretrained` loads that directory with the
weights of the source checkpoint, bit for bit (nothing trained in between; fp32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from airtest import torchrun_ranks

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

SHARD_BYTES = 40_000

JOB = """
import os, sys
import torch
import air_sdk.runtime as air
from transformers import AutoConfig, AutoModelForCausalLM

src, ckpt = sys.argv[1], sys.argv[2]
ctx = air.init(timeout_s=120)
torch.set_num_threads(1)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
model = air.parallelize(model)
air.load_pretrained(model, src)
air.checkpoint.configure(ckpt)
air.checkpoint.save({"model": model}, step=1, block=True)
print(f"rank {ctx.rank} saved", flush=True)
del model
air.shutdown()
"""


def _air(*args: str) -> subprocess.CompletedProcess[str]:
    import air_sdk

    env = {**os.environ, "PYTHONPATH": str(Path(air_sdk.__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "air_sdk.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def job_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hfshards")
    config = transformers.Qwen2Config(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(3)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # biases of zero would hide a bias in the wrong file
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    src = root / "qwen2"
    model.save_pretrained(src)
    script = root / "job.py"
    script.write_text(textwrap.dedent(JOB))
    logs = torchrun_ranks(
        2, script, str(src), str(root / "ckpt"), AIR_PARALLELISM='{"dp_shard": 2}'
    )
    assert "rank 0 saved" in logs and "rank 1 saved" in logs, logs
    return src, root / "ckpt"


def test_a_small_max_shard_size_writes_shards_and_an_index_from_pretrained_loads(
    job_checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    src, ckpt = job_checkpoint
    out = tmp_path / "tuned"
    done = _air(
        "checkpoints", "export", str(ckpt), "--to", str(out), "--format", "hf",
        "--config", str(src), "--max-shard-size", str(SHARD_BYTES), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    shards = json.loads(done.stdout)["shards"]
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) >= 3 and files == sorted(shards)
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert not (out / "model.safetensors").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files

    from safetensors import safe_open

    total = 0
    for name in files:
        with safe_open(out / name, framework="pt") as f:
            names = f.keys()  # a safe_open is not iterable
            sizes = [f.get_slice(k).get_shape() for k in names]
            nbytes = [4 * torch.Size(s).numel() for s in sizes]
            assert sum(nbytes) <= SHARD_BYTES or len(nbytes) == 1, (name, nbytes)
            total += sum(nbytes)
            assert all(index["weight_map"][k] == name for k in names)
    assert index["metadata"]["total_size"] == total

    want = transformers.AutoModelForCausalLM.from_pretrained(src).state_dict()
    got = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert (out / "config.json").is_file()


def test_the_default_writes_one_file_and_a_sharded_export_refuses_a_used_directory(
    job_checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    src, ckpt = job_checkpoint
    out = tmp_path / "one"
    done = _air("checkpoints", "export", str(ckpt), "--to", str(out), "--format", "hf",
                "--config", str(src))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()
    again = _air("checkpoints", "export", str(ckpt), "--to", str(out), "--format", "hf",
                 "--config", str(src), "--max-shard-size", "40KB")  # fmt: skip
    assert again.returncode != 0
    assert "export to an empty directory" in again.stdout + again.stderr
    bad = _air("checkpoints", "export", str(ckpt), "--to", str(tmp_path / "x"), "--format",
               "hf", "--config", str(src), "--max-shard-size", "5 gigs")  # fmt: skip
    assert bad.returncode != 0
    assert "e.g. 5GB" in bad.stdout + bad.stderr
