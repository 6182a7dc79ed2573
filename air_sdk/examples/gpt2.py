"""GPT-2 in the style of nanoGPT, and a training script for it.

The model: token and learned position embeddings, pre-LayerNorm blocks of causal
self-attention (PyTorch's SDPA: flash attention where the device has it) and a
GELU MLP, a final LayerNorm and an output layer tied to the token embedding.
Configs: `gpt2-124m` (GPT-2 small, vocab padded to 50304), `gpt2-350m`, `tiny`
(for CPU tests). `air plan gpt2-124m` has the same shape.

The script trains it on synthetic tokens (or a nanoGPT-style uint16 `train.bin`),
data parallel with DDP or FSDP2, optionally bf16 and `torch.compile`, and logs
`loss` and `tokens` per step: AIR turns them into tokens/s and MFU.

    torchrun --nproc-per-node 8 -m air_sdk.examples.gpt2 --config gpt2-124m --fsdp --bf16
    air submit air_sdk/examples/gpt2.py --nodes 2 --gpus-per-node 8 -- --fsdp --bf16
    python -m air_sdk.examples.gpt2 --config tiny --steps 20          # one CPU process
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import air_sdk.runtime as air

__all__ = ["CONFIGS", "GPT", "GPTConfig", "main"]


@dataclass(frozen=True)
class GPTConfig:
    """GPT-2's dimensions.

    Example:
        >>> CONFIGS["gpt2-124m"].n_embd
        768
    """

    block_size: int = 1024
    vocab_size: int = 50_304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    #: nanoGPT trains GPT-2 without dropout; > 0 adds it after attention and the MLP
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")


CONFIGS: dict[str, GPTConfig] = {
    "gpt2-124m": GPTConfig(),
    "gpt2-350m": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "tiny": GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=64),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: `model(idx, targets)` returns (logits, loss); loss is None without targets.

    Example:
        >>> model = GPT(CONFIGS["tiny"])
        >>> logits, loss = model(torch.zeros(2, 8, dtype=torch.long))
        >>> tuple(logits.shape), loss
        ((2, 8, 256), None)
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        seq = idx.shape[1]
        if seq > self.config.block_size:
            raise ValueError(
                f"sequence of {seq} tokens; the block size is {self.config.block_size}"
            )
        pos = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        # The loss in fp32 whatever the compute dtype (as torchtitan and nanoGPT do).
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


# -- training -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train GPT-2 (nanoGPT style) under AIR.")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="gpt2-124m")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the block size")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    parser.add_argument("--bf16", action="store_true", help="bf16 compute (needs a GPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps")
    parser.add_argument("--data", type=Path, default=None, help="uint16 token file (train.bin)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--result", type=Path, default=None, help="rank 0 writes its step times here (JSON)"
    )
    return parser.parse_args(argv)


class TokenBatches:
    """Random windows of a uint16 token file, or synthetic tokens without one; each rank
    draws its own from a seeded generator."""

    def __init__(self, path: Path | None, vocab: int, seq: int, seed: int) -> None:
        self.vocab, self.seq = vocab, seq
        self.tokens: Any = None
        if path is not None:
            import numpy as np

            self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.generator = torch.Generator().manual_seed(seed)

    def next(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tokens is None:
            data = torch.randint(0, self.vocab, (batch, self.seq + 1), generator=self.generator)
        else:
            import numpy as np

            starts = torch.randint(
                0, len(self.tokens) - self.seq - 1, (batch,), generator=self.generator
            )
            rows = [np.asarray(self.tokens[s : s + self.seq + 1], dtype=np.int64) for s in starts]
            data = torch.from_numpy(np.stack(rows))
        data = data.to(device, non_blocking=True)
        return data[:, :-1], data[:, 1:]


def _wrap(model: GPT, args: argparse.Namespace, device: torch.device) -> nn.Module:
    """DDP, or FSDP2 per block and then the root through `air.parallelize`, with bf16
    compute when asked."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return model
    if not args.fsdp:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None
        )
    # FSDP2 per block, then the root, from the job's layout (every rank a data-parallel one)
    return air.parallelize(model, mixed_precision="bf16" if args.bf16 else "fp32")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train; returns the final loss and the step times (what benchmarks read)."""
    args = parse_args(argv)
    ctx = air.init()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", ctx.local_rank) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(ctx.local_world_size, 1)))
    if args.bf16 and not cuda:
        raise SystemExit("--bf16 needs a GPU: drop it on CPU")
    config = CONFIGS[args.config]
    seq = args.seq_len or config.block_size
    config = replace(config, block_size=max(seq, config.block_size))
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(config).to(device)
    num_params = model.num_params()
    wrapped = _wrap(model, args, device)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.lr, betas=(0.9, 0.95), fused=cuda)
    step_fn: Any = torch.compile(wrapped) if args.compile else wrapped
    data = TokenBatches(args.data, config.vocab_size, seq, args.seed + 1 + ctx.rank)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=args.bf16 and not args.fsdp)
    state = {"model": wrapped, "optim": optimizer}
    start = (air.checkpoint.load(state) or 0) if args.ckpt_every else 0
    if ctx.rank == 0:
        print(
            f"GPT-2 {args.config}: {num_params / 1e6:.1f}M params, {ctx.world_size} ranks,"
            f" {args.batch_size} x {seq} tokens per rank and step, on {device.type}",
            flush=True,
        )
    times: list[float] = []
    loss_value = float("nan")
    for step in range(start + 1, args.steps + 1):
        began = time.perf_counter()
        x, y = data.next(args.batch_size, device)
        with autocast:
            _, loss = step_fn(x, y)
        assert loss is not None
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()  # a device sync: the step is over when it returns
        air.log(step=step, loss=loss_value, tokens=args.batch_size * seq)
        if args.ckpt_every and step % args.ckpt_every == 0:
            air.checkpoint.save(state, step=step)  # what it blocks counts in the step
        times.append(time.perf_counter() - began)
        if ctx.rank == 0 and (step % 10 == 0 or step == args.steps):
            print(f"step {step:>5}  loss {loss_value:.4f}  {times[-1] * 1e3:.1f} ms", flush=True)
    result = _summary(times, loss_value, num_params, args.batch_size * seq * ctx.world_size)
    if args.result is not None and ctx.rank == 0:
        result["device"] = torch.cuda.get_device_name(device) if cuda else "cpu"
        args.result.write_text(json.dumps(result))
    del step_fn, wrapped, model, optimizer, state
    gc.collect()
    air.shutdown()
    return result


def _summary(
    times: list[float], loss: float, num_params: int, tokens_per_step: int
) -> dict[str, Any]:
    """Step times past the warm-up (the first fifth: compilation, allocator growth)."""
    steady = times[len(times) // 5 :] or [float("nan")]
    ordered = sorted(steady)
    return {
        "loss": loss,
        "num_params": num_params,
        "tokens_per_step": tokens_per_step,
        "num_steps": len(steady),
        "step_s_median": ordered[len(ordered) // 2],
        "step_s_mean": sum(steady) / len(steady),
        "step_s_max": ordered[-1],
    }


if __name__ == "__main__":
    main()
