"""Peak memory per rank while building a model under FSDP(4): built on the meta device
(`air.parallelize` materializes only this rank's shards) against built eagerly (every
rank holds the whole model first), side by side in one run.

Four gloo ranks (torch.multiprocessing), the tiny Llama of `air_sdk.examples.llama`
made bigger (`--layers` blocks of dim 1024: 42 MB each in fp32). Each rank reports its
peak RSS (`ru_maxrss`) minus its RSS after joining the group and building the mesh:
what the build added. `--repeats` runs of each path, alternating; medians reported.
glibc's mmap threshold is fixed at 1 MB (`MALLOC_MMAP_THRESHOLD_`) so freed blocks go
back to the system as torch frees them.

    .venv/bin/python benchmarks/meta_init.py --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import socket
import statistics
import tempfile
from pathlib import Path

WORLD = 4


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _rank(rank: int, port: int, out: str, meta: bool, layers: int) -> None:
    import torch
    import torch.distributed as dist

    import air_sdk.runtime.parallel as parallel
    from air_sdk.examples.llama import LlamaConfig, build_llama
    from air_sdk.schema import Parallelism

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    mesh = parallel.mesh(Parallelism().resolve(WORLD))
    config = LlamaConfig(
        n_layers=layers, dim=1024, hidden_dim=2048, n_heads=8, vocab_size=256, max_seq_len=64
    )
    base = _rss()
    if meta:
        with torch.device("meta"):
            model = build_llama(config)
    else:
        model = build_llama(config)
    model = parallel.parallelize(model, mesh=mesh, mixed_precision="fp32")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    params = sum(p.numel() for p in model.parameters()) * 4  # global numel: whole model
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"added": peak - max(base, 0), "model_bytes": params})
    )
    dist.barrier()
    del model
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(meta: bool, layers: int) -> tuple[float, int]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank,
            args=(_port(), out, meta, layers),
            nprocs=WORLD,
            join=True,
            start_method="spawn",
        )
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    return statistics.median(r["added"] for r in ranks), ranks[0]["model_bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=10)
    args = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    added: dict[str, list[float]] = {"meta": [], "eager": []}
    model_bytes = 0
    for _ in range(args.repeats):
        for name in ("meta", "eager"):
            value, model_bytes = _run(name == "meta", args.layers)
            added[name].append(value)
    mib = 2**20
    meta, eager = statistics.median(added["meta"]), statistics.median(added["eager"])
    print(f"model: {model_bytes / mib:.0f} MiB of fp32 parameters; FSDP(4); {WORLD} ranks")
    print("peak RSS added by the build, per rank (median of ranks, then of runs):")
    print(f"  meta:  {meta / mib:7.1f} MiB   runs {[round(v / mib) for v in added['meta']]}")
    print(f"  eager: {eager / mib:7.1f} MiB   runs {[round(v / mib) for v in added['eager']]}")
    print(f"  meta / eager: {meta / eager:.2f}")


if __name__ == "__main__":
    main()
