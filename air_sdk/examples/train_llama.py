"""Train the tiny Llama under whatever layout the job asks for (FSDP, HSDP, TP, PP).

The script names no size: the layout comes from the job (`JobSpec.parallelism`, the
`--tp/--pp/--dp-shard` flags) through `AIR_PARALLELISM`; by hand or under bare torchrun
it is plain FSDP over every rank. With pp > 1 it trains through `air.pipeline`, else
`air.parallelize`. Each data-parallel rank reads its rows of one global batch; the
loss logged is the mean over all of them.

    torchrun --nproc-per-node 4 train_llama.py --steps 50
    air submit train_llama.py --nodes 2 --procs-per-node 2 --tp 2 --follow -- --steps 50
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

import air_sdk.runtime as air
from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn, synthetic_batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps")
    parser.add_argument("--naming", choices=["titan", "hf"], default="titan", help="module names")
    parser.add_argument("--batch-size", type=int, default=8, help="global batch (rows)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per row")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--microbatches", type=int, default=2, help="per step, with pp > 1")
    parser.add_argument(
        "--schedule",
        default="1F1B",
        choices=["1F1B", "GPipe", "Interleaved1F1B"],
        help="pp schedule",
    )
    parser.add_argument("--activation-checkpointing", action="store_true", help="per block")
    parser.add_argument("--seed", type=int, default=0, help="weights and data seed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    """Train; returns the last logged loss (the mean over data-parallel ranks)."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # ranks share the machine's cores
    ctx = air.init()
    layout = air.parallel.layout_of(air.mesh())
    dp = air.submesh("dp")
    if args.batch_size % dp.size():
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {dp.size()} dp ranks")
    per_rank = args.batch_size // dp.size()
    rows = slice(dp.get_local_rank() * per_rank, (dp.get_local_rank() + 1) * per_rank)
    config = LlamaConfig(naming=args.naming, n_kv_heads=2, seed=args.seed)
    model = build_llama(config)  # the same weights on every rank (FSDP2 does not broadcast)
    ac = args.activation_checkpointing
    if layout.pp > 1:
        pipe = air.pipeline(
            model,
            microbatches=args.microbatches,
            loss_fn=loss_fn,
            schedule=args.schedule,
            activation_checkpointing=ac,
        )
        params = list(pipe.parameters())
    else:
        model = air.parallelize(model, activation_checkpointing=ac)
        params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    if ctx.rank == 0:
        print(f"layout {layout.sizes()} on {ctx.world_size} ranks", flush=True)

    loss_value = float("nan")
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        tokens, targets = synthetic_batch(
            config, batch_size=args.batch_size, seq_len=args.seq_len, step=step, seed=args.seed
        )
        if layout.pp > 1:
            loss = pipe.step(tokens[rows], targets[rows])
        else:
            loss = loss_fn(model(tokens[rows]), targets[rows])
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = air.dp_mean(loss)
        elapsed = max(time.perf_counter() - started, 1e-9)
        air.log(step=step, loss=loss_value, tokens_per_s=args.batch_size * args.seq_len / elapsed)
        if ctx.rank == 0 and (step % 10 == 0 or step == args.steps):
            print(f"step {step:>4}  loss {loss_value:.4f}", flush=True)

    del model, optimizer, params
    if layout.pp > 1:
        del pipe
    gc.collect()
    air.shutdown()
    return loss_value


if __name__ == "__main__":
    main()
