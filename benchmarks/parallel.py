"""`air.parallelize` against the same parallelism written out by hand, torchtitan-style.

Four gloo ranks on this machine (torch.multiprocessing), one model (the tiny Llama of
`air_sdk.examples.llama`, made bigger), one mesh. For each layout (FSDP(4) and
TP(2) x FSDP(2)), two copies of the model from the same seed: one through
`air.parallelize(model)`, one through `parallelize_module` + `fully_shard` written out
below as torchtitan's `apply_tp`/`apply_fsdp` do it. Their training
steps (forward, backward, AdamW) alternate one by one, `--pairs` timed pairs after
`--warmup` untimed ones. Reported: the median step time of each, the median of the
per-pair ratios (each pair ran under the same load), and the largest loss difference
between the two (they should agree: same math). On a shared machine wall time
swings with the load, so each step's CPU time (`time.process_time()` of every rank,
its threads included, summed over the ranks) is reported too: the work a step costs,
whoever else runs.

Memory: per-rank bytes of parameters + gradients + optimizer state after one AdamW
step, FSDP(4) through `air.parallelize` against DDP (`DistributedDataParallel`), same
model.

    .venv/bin/python benchmarks/parallel.py --pairs 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import QUIET_ENV, fmt, free_port, header, markdown_table, median, write_result

WORLD = 4


def model_config(naming: str = "titan") -> Any:
    from air_sdk.examples.llama import LlamaConfig

    return LlamaConfig(
        naming=naming, vocab_size=1024, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, hidden_dim=768
    )


def by_hand(model: Any, mesh: Any, tp: int) -> Any:
    """What a torchtitan user writes for the same layout (apply_tp + apply_fsdp)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if tp > 1:
        tp_mesh = mesh["tp"]
        parallelize_module(
            model,
            tp_mesh,
            {
                "tok_embeddings": RowwiseParallel(
                    input_layouts=Replicate(), output_layouts=Shard(1)
                ),
                "norm": SequenceParallel(),
                "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            },
        )
        for block in model.layers:
            plan = {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            }
            parallelize_module(block, tp_mesh, plan)
            block.attention.n_heads //= tp
            block.attention.n_kv_heads //= tp
    dp_mesh = mesh["dp_shard"]
    policy = MixedPrecisionPolicy()
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    return model


def state_bytes(model: Any, optimizer: Any) -> int:
    """This rank's bytes of parameters, gradients and optimizer state (local shards)."""
    from torch.distributed.tensor import DTensor

    def local(t: Any) -> Any:
        return t.to_local() if isinstance(t, DTensor) else t

    total = 0
    for p in model.parameters():
        total += local(p).numel() * local(p).element_size()
        if p.grad is not None:
            total += local(p.grad).numel() * local(p.grad).element_size()
    for state in optimizer.state.values():
        for value in state.values():
            if hasattr(value, "numel") and value.dim() > 0:
                total += local(value).numel() * local(value).element_size()
    return total


def worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(QUIET_ENV)
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
         "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )  # fmt: skip
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import air_sdk.runtime as air
    from air_sdk.examples.llama import build_llama, loss_fn, synthetic_batch
    from air_sdk.schema import Parallelism

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result: dict[str, Any] = {"layouts": {}}
    config = model_config()
    tokens, targets = synthetic_batch(config, batch_size=8, seq_len=args.seq, step=0)
    for name, layout in (
        ("FSDP(4)", Parallelism(dp_shard=4)),
        ("TP(2)xFSDP(2)", Parallelism(tp=2)),
    ):
        mesh = air.mesh(layout)
        dp = air.submesh("dp")
        rows = slice(
            dp.get_local_rank() * 8 // dp.size(), (dp.get_local_rank() + 1) * 8 // dp.size()
        )
        x, y = tokens[rows], targets[rows]
        models = {
            "air": air.parallelize(build_llama(config)),
            "hand": by_hand(build_llama(config), mesh, layout.tp),
        }
        opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
        times: dict[str, list[float]] = {"air": [], "hand": []}
        cpu: dict[str, list[float]] = {"air": [], "hand": []}
        losses: dict[str, list[float]] = {"air": [], "hand": []}
        # Step by step, alternating which goes first in each pair: on a shared machine
        # the load changes within seconds, and a pair sees the same load.
        for pair in range(args.warmup + args.pairs):
            for key in ("air", "hand") if pair % 2 == 0 else ("hand", "air"):
                dist.barrier()
                started, cpu_started = time.perf_counter(), time.process_time()
                loss = loss_fn(models[key](x), y)
                loss.backward()
                opts[key].step()
                opts[key].zero_grad()
                elapsed = time.perf_counter() - started
                cpu_used = time.process_time() - cpu_started
                losses[key].append(loss.item())
                if pair >= args.warmup:
                    times[key].append(elapsed)
                    cpu[key].append(cpu_used)
        for key in cpu:  # CPU seconds of all ranks (their threads too) per step
            summed = torch.tensor(cpu[key], dtype=torch.float64)
            dist.all_reduce(summed)
            cpu[key] = summed.tolist()
        result["layouts"][name] = {
            "times": times,
            "cpu": cpu,
            "max_loss_diff": max(
                abs(a - b) for a, b in zip(losses["air"], losses["hand"], strict=True)
            ),
        }
        del models, opts

    # memory: FSDP(4) through air.parallelize vs DDP, after one AdamW step (grads kept)
    air.mesh(Parallelism(dp_shard=4))
    measured = {}
    for key in ("fsdp", "ddp"):
        plain = build_llama(config)
        model = air.parallelize(plain) if key == "fsdp" else DistributedDataParallel(plain)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn(model(tokens[rank * 2 : rank * 2 + 2]), targets[rank * 2 : rank * 2 + 2]).backward()
        optimizer.step()
        measured[key] = state_bytes(model, optimizer)
        del model, optimizer
    result["state_bytes"] = measured
    result["params"] = sum(p.numel() for p in build_llama(config).parameters())
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    air.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40, help="timed steps of each, interleaved")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each first")
    parser.add_argument("--seq", type=int, default=128, help="sequence length")
    args = parser.parse_args(argv)

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        load_before = os.getloadavg()[0]
        mp.spawn(worker, args=(free_port(), args, out), nprocs=WORLD, join=True)
        load_after = os.getloadavg()[0]
        result = json.loads(Path(out).read_text())

    rows = []
    for name, layout in result["layouts"].items():
        air_s, hand_s = layout["times"]["air"], layout["times"]["hand"]
        ratios = [a / h for a, h in zip(air_s, hand_s, strict=True)]
        air_cpu, hand_cpu = layout["cpu"]["air"], layout["cpu"]["hand"]
        rows.append(
            [name, fmt(median(air_s) * 1e3, 1), fmt(median(hand_s) * 1e3, 1),
             fmt(median(air_s) / median(hand_s), 3), fmt(median(ratios), 3),
             fmt(median(air_cpu) * 1e3, 1), fmt(median(hand_cpu) * 1e3, 1),
             fmt(median(air_cpu) / median(hand_cpu), 3),
             f"{layout['max_loss_diff']:.1e}", len(air_s)]
        )  # fmt: skip
    fsdp, ddp = result["state_bytes"]["fsdp"], result["state_bytes"]["ddp"]
    print(header("Parallelism: air.parallelize vs torchtitan-style code by hand"))
    print(
        f"\n{WORLD} gloo ranks, {result['params']:,} parameters, seq {args.seq}; load {load_before:.1f} -> {load_after:.1f}\n"
    )
    print(markdown_table(
        ["layout", "air ms/step", "by hand ms/step", "ratio of medians", "median pair ratio",
         "air CPU ms/step", "by hand CPU ms/step", "CPU ratio", "max loss diff", "pairs"], rows
    ))  # fmt: skip
    print()
    print(markdown_table(
        ["per rank", "params + grads + AdamW state", "x DDP"],
        [["DDP", f"{ddp / 2**20:.2f} MiB", "1.000"],
         ["FSDP(4) via air.parallelize", f"{fsdp / 2**20:.2f} MiB", fmt(fsdp / ddp, 3)]],
    ))  # fmt: skip
    path = write_result(
        "parallel",
        {"args": vars(args), "load": [load_before, load_after], **result},
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
