"""`air.load_pretrained` under FSDP(4) against `from_pretrained` on every rank followed by
sharding: wall time to a sharded, loaded model and peak memory per rank, anonymous
(what the process owns: heap, tensors) apart from file-backed (pages of the mmapped
safetensors, clean page cache the kernel can drop), side by side in one run, medians
over repeats (the two ways alternate, so both see the same load).

    .venv/bin/python benchmarks/load_pretrained.py --repeats 3 --layers 16 --dim 1024

The checkpoints are one `transformers` LlamaForCausalLM from a config (no hub), saved
twice with `save_pretrained`: in float32, and in bfloat16 (as checkpoints on the hub
are) loaded into a float32 model (the master weights FSDP trains). `air` builds on the
meta device, shards with `air.parallelize`, then reads each rank's slices;
`from_pretrained` builds and loads the whole model on every rank, then
`air.parallelize` shards it.

Memory is sampled every 2 ms by a thread in each rank from `/proc/self/status`
(`RssAnon`, `RssFile`), as the peak over the load minus the rank's baseline
(everything imported, the process group and meshes up, nothing of the model yet).
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
import json, sys, threading, time
import torch
import air_sdk.runtime as air
from transformers import AutoConfig, AutoModelForCausalLM


def status():
    with open("/proc/self/status") as f:
        rows = dict(line.split(":", 1) for line in f)
    return {k: int(rows[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile")}


mode, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = air.init(timeout_s=300)
torch.set_num_threads(1)
# the baseline: everything imported and the process group up, nothing of the model yet
import torch.distributed.checkpoint, torch.distributed.fsdp, torch.distributed.tensor.parallel
import transformers.models.llama.modeling_llama
air.submesh("dp")
base = status()
peak = dict(base)
running = True


def sample():
    while running:
        for key, value in status().items():
            peak[key] = max(peak[key], value)
        time.sleep(0.002)


sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
begin = time.perf_counter()
if mode == "air":
    config = AutoConfig.from_pretrained(src)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = air.parallelize(model)  # allocates this rank's shards and initializes them
    first = dict(peak)
    middle = time.perf_counter()
    air.load_pretrained(model, src)
else:
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    first = dict(peak)
    middle = time.perf_counter()
    model = air.parallelize(model)
took = time.perf_counter() - begin
running = False
sampler.join()
end = status()
with open(f"{out}.{ctx.rank}", "w") as f:
    json.dump({
        "load_s": took,
        "first_s": middle - begin,
        "first_peak_anon_mib": first["RssAnon"] - base["RssAnon"],
        "peak_anon_mib": peak["RssAnon"] - base["RssAnon"],
        "peak_file_mib": peak["RssFile"] - base["RssFile"],
        "end_anon_mib": end["RssAnon"] - base["RssAnon"],
        "base_anon_mib": base["RssAnon"],
    }, f)
del model
air.shutdown()
"""

LABELS = {
    "air": "`air.load_pretrained` (meta, FSDP(4))",
    "from_pretrained": "`from_pretrained` on every rank, then FSDP(4)",
}


def make_checkpoints(work: Path, layers: int, dim: int) -> tuple[int, dict[str, Path]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=dim,
        intermediate_size=dim * 3,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=32000,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    sources = {"float32": work / "fp32", "bfloat16": work / "bf16"}
    model.save_pretrained(sources["float32"])
    model.to(torch.bfloat16).save_pretrained(sources["bfloat16"])
    return sum(p.numel() for p in model.parameters()), sources


def run_once(mode: str, src: Path, work: Path, name: str) -> list[dict[str, float]]:
    script = work / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    out = work / name
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
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--dim", type=int, default=1024)
    args = parser.parse_args()
    results: dict[str, dict[str, list[list[dict[str, float]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="air-bench-load-") as tmp:
        work = Path(tmp)
        num_params, sources = make_checkpoints(work, args.layers, args.dim)
        sizes = {
            dtype: sum(f.stat().st_size for f in src.glob("*.safetensors")) / 2**20
            for dtype, src in sources.items()
        }
        for dtype, src in sources.items():
            results[dtype] = {"air": [], "from_pretrained": []}
            for index in range(args.repeats):
                order = ("air", "from_pretrained") if index % 2 == 0 else ("from_pretrained", "air")
                for mode in order:
                    name = f"{dtype}-{mode}-{index}"
                    results[dtype][mode].append(run_once(mode, src, work, name))
    rows = []
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for dtype, by_mode in results.items():
        summary[dtype] = {}
        for mode, runs in by_mode.items():
            # per run: the slowest rank's time (the job waits for it), the largest peaks
            keys = ("load_s", "first_s", "peak_anon_mib", "first_peak_anon_mib",
                    "peak_file_mib", "end_anon_mib")  # fmt: skip
            stats = {key: median([max(r[key] for r in run) for run in runs]) for key in keys}
            summary[dtype][mode] = stats
            rows.append([
                f"{dtype} file ({sizes[dtype]:.0f} MiB)", LABELS[mode],
                f"{stats['load_s']:.2f} ({stats['first_s']:.2f})",
                f"{stats['peak_anon_mib']:.0f} ({stats['first_peak_anon_mib']:.0f})",
                f"{stats['end_anon_mib']:.0f}", f"{stats['peak_file_mib']:.0f}",
            ])  # fmt: skip
    model_mib = num_params * 4 / 2**20
    print(f"{num_params / 1e6:.1f}M parameters, {model_mib:.0f} MiB in float32, 4 ranks")
    # (first step): air's parallelize (allocate + initialize), or from_pretrained itself
    headers = [
        "checkpoint", "way", "s to a loaded model (first step)",
        "peak anon MiB over baseline (first step)", "anon MiB after", "peak file-backed MiB",
    ]  # fmt: skip
    print(markdown_table(headers, rows))
    write_result(
        "load_pretrained",
        {"when": now_iso(), "num_params": num_params, "summary": summary, "raw": results},
    )


if __name__ == "__main__":
    main()
