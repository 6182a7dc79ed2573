"""`air.load_pretrained` under FSDP(4) against `from_pretrained` on every rank followed by
sharding: wall time to a sharded, loaded model and peak RSS per rank, side by side in
one run, medians over repeats (the two ways alternate, so both see the same load).

    .venv/bin/python benchmarks/load_pretrained.py --repeats 3 --layers 8 --dim 512

The checkpoint is a `transformers` LlamaForCausalLM from a config (no hub), saved with
`save_pretrained` into a temporary directory. `air` builds on the meta device, shards
with `air.parallelize`, then reads each rank's slices; `from_pretrained` builds and
loads the whole model on every rank, then `air.parallelize` shards it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import QUIET_ENV, markdown_table, median, now_iso, write_result  # noqa: E402

RANK_SCRIPT = """
import json, os, resource, sys, time
start = time.perf_counter()
import torch
import air_sdk.runtime as air
from transformers import AutoConfig, AutoModelForCausalLM

mode, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = air.init(timeout_s=300)
torch.set_num_threads(1)
# the baseline: everything imported and the process group up, nothing of the model yet
import torch.distributed.checkpoint, torch.distributed.fsdp, torch.distributed.tensor.parallel
import transformers.models.llama.modeling_llama
air.parallelize(torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(4, 4)])))
base_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
begin = time.perf_counter()
if mode == "air":
    config = AutoConfig.from_pretrained(src)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = air.parallelize(model)
    air.load_pretrained(model, src)
else:
    model = AutoModelForCausalLM.from_pretrained(src)
    model = air.parallelize(model)
took = time.perf_counter() - begin
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
with open(f"{out}.{ctx.rank}", "w") as f:
    json.dump({"load_s": took, "peak_rss_mib": peak_mib, "added_rss_mib": peak_mib - base_mib}, f)
del model
air.shutdown()
"""


def make_checkpoint(directory: Path, layers: int, dim: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=dim,
        intermediate_size=dim * 3,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=8192,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def run_once(mode: str, src: Path, work: Path, index: int) -> list[dict[str, float]]:
    script = work / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    out = work / f"{mode}-{index}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIR_", "TORCHELASTIC_"))}
    env.update(QUIET_ENV, AIR_PARALLELISM=json.dumps({"dp_shard": 4}))
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    subprocess.run([*cmd, str(script), mode, str(src), str(out)], env=env, check=True,
                   capture_output=True, timeout=900)  # fmt: skip
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="air-bench-load-") as tmp:
        work = Path(tmp)
        src = work / "model"
        num_params = make_checkpoint(src, args.layers, args.dim)
        results: dict[str, list[list[dict[str, float]]]] = {"air": [], "from_pretrained": []}
        for index in range(args.repeats):
            order = ("air", "from_pretrained") if index % 2 == 0 else ("from_pretrained", "air")
            for mode in order:
                results[mode].append(run_once(mode, src, work, index))
        size_mib = sum(f.stat().st_size for f in src.glob("*.safetensors")) / 2**20
    rows = []
    summary: dict[str, dict[str, float]] = {}
    for mode, runs in results.items():
        # per run: the slowest rank's time (the job waits for it), the largest peak RSS
        load = median([max(r["load_s"] for r in run) for run in runs])
        rss = median([max(r["peak_rss_mib"] for r in run) for run in runs])
        added = median([max(r["added_rss_mib"] for r in run) for run in runs])
        summary[mode] = {"load_s": load, "peak_rss_mib": rss, "added_rss_mib": added}
        label = "`air.load_pretrained` (meta, FSDP(4))" if mode == "air" else (
            "`from_pretrained` on every rank, then FSDP(4)")  # fmt: skip
        rows.append([label, f"{load:.2f}", f"{rss:.0f}", f"{added:.0f}"])
    print(f"{num_params / 1e6:.1f}M parameters, {size_mib:.0f} MiB of safetensors, 4 ranks")
    headers = ["way", "load s", "peak RSS MiB per rank", "of it added by the load, MiB"]
    print(markdown_table(headers, rows))
    write_result(
        "load_pretrained",
        {"when": now_iso(), "num_params": num_params, "summary": summary, "raw": results},
    )


if __name__ == "__main__":
    main()
