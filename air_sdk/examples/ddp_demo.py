"""A small DDP regression job: the script `air demo` runs on every rank.

A plain torchrun script (it also runs under bare `torchrun` or by hand as one
process): an MLP learns a fixed random function from synthetic data, each rank
drawing its own shard from a seeded generator, gradients averaged by DDP.

    torchrun --nproc-per-node 2 ddp_demo.py --steps 200
    air submit ddp_demo.py --nodes 2 --follow -- --steps 200
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import air_sdk.runtime as air

NUM_FEATURES = 16
SAMPLES_PER_RANK = 4096
PRINT_EVERY = 50


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--hidden", type=int, default=64, help="MLP width")
    parser.add_argument("--seed", type=int, default=0, help="data and init seed")
    return parser.parse_args(argv)


def make_shard(seed: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's samples of one fixed target function (the same on every rank)."""
    target = torch.Generator().manual_seed(seed)
    w1 = torch.randn(NUM_FEATURES, 8, generator=target)
    w2 = torch.randn(8, 1, generator=target)
    shard = torch.Generator().manual_seed(seed + 1 + rank)
    x = torch.randn(SAMPLES_PER_RANK, NUM_FEATURES, generator=shard)
    # Scaled so the target has unit-ish variance and the loss curve is easy to read.
    y = torch.tanh(x @ w1 / NUM_FEATURES**0.5) @ w2 / 8**0.5
    y = y + 0.05 * torch.randn(SAMPLES_PER_RANK, 1, generator=shard)
    return x, y


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # ranks share the machine's cores
    ctx = air.init()
    torch.manual_seed(args.seed)  # the same initial weights on every rank

    x, y = make_shard(args.seed, ctx.rank)
    model = DistributedDataParallel(
        nn.Sequential(
            nn.Linear(NUM_FEATURES, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, 1),
        )
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    order = torch.Generator().manual_seed(args.seed + 1000 + ctx.rank)
    if ctx.rank == 0:
        print(
            f"job {ctx.job_id or '-'} attempt {ctx.attempt}: {ctx.world_size} ranks,"
            f" {args.steps} steps of {args.batch_size} samples per rank",
            flush=True,
        )

    loss_value = float("nan")
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        batch = torch.randint(0, SAMPLES_PER_RANK, (args.batch_size,), generator=order)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[batch]), y[batch])
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        loss_value = loss.item()
        elapsed = max(time.perf_counter() - started, 1e-9)
        air.log(
            step=step,
            loss=loss_value,
            samples_per_s=args.batch_size * ctx.world_size / elapsed,
        )
        if ctx.rank == 0 and (step % PRINT_EVERY == 0 or step == args.steps):
            print(f"step {step:>5}  loss {loss_value:.4f}", flush=True)

    if ctx.rank == 0:
        print(f"done: final loss {loss_value:.4f}", flush=True)
    # Drop DDP's reducer before the process group goes (torch 2.x can SIGABRT otherwise).
    del model, optimizer
    gc.collect()
    air.shutdown()


if __name__ == "__main__":
    main()
