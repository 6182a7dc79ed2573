"""Rank functions (`torch.multiprocessing` targets) for the meta-device tests: models built
on the meta device, parallelized by `air.parallelize` / `air.pipeline`, with each rank's
results written to `rank<R>.pt` / `rank<R>.json` for the test to read.

- `full_states`: the full (gathered) state of the materialized model under each layout;
- `capped_training`: a big model trained under a per-rank memory cap (RLIMIT_DATA).
"""

from __future__ import annotations

import datetime
import json
import os
import resource
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn, synthetic_batch
from air_sdk.schema import Parallelism

WORLD = 4
LLAMA = LlamaConfig(n_layers=4, n_heads=4, n_kv_heads=2, dim=64, hidden_dim=96, vocab_size=96)
#: name -> Parallelism sizes over 4 ranks
LAYOUTS = {
    "FSDP4": {},
    "TP2 x FSDP2": {"tp": 2},
    "PP2 x FSDP2": {"pp": 2},
    "PP2 x TP2": {"pp": 2, "tp": 2, "dp_shard": 1},
}
#: a model of about 840 MB of fp32 parameters in 42 MB blocks
BIG = LlamaConfig(n_layers=20, dim=1024, hidden_dim=2048, n_heads=8, vocab_size=256, max_seq_len=64)
BIG_LAYOUTS = {"FSDP4": {}, "TP2 x FSDP2": {"tp": 2}}


class PlainBlock(nn.Module):
    """Only torch modules: initialized by their own `reset_parameters()`."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class PlainNet(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, n_layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(PlainBlock(dim) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def plain_net(seed: int = 0) -> PlainNet:
    torch.manual_seed(seed)
    return PlainNet()


def _join(rank: int, port: int) -> None:
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


def _layout(sizes: dict[str, int]) -> Parallelism:
    layout = Parallelism(**sizes).resolve(WORLD)
    os.environ["AIR_PARALLELISM"] = layout.model_dump_json()
    return layout


def _parts(model: nn.Module, layout: Parallelism) -> list[nn.Module]:
    import air_sdk.runtime.parallel as parallel

    mesh = parallel.mesh(layout)
    if layout.pp > 1:
        pipe = parallel.pipeline(
            model, microbatches=2, loss_fn=loss_fn, mesh=mesh, mixed_precision="fp32"
        )
        return pipe.model_parts
    return [parallel.parallelize(model, mesh=mesh, mixed_precision="fp32")]


def _full_state(parts: list[nn.Module]) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    state: dict[str, torch.Tensor] = {}
    for part in parts:
        full = get_model_state_dict(part, options=StateDictOptions(full_state_dict=True))
        state.update({k: v.detach().clone() for k, v in full.items()})
        for name, buffer in part.named_buffers():  # non-persistent ones too (rotary)
            if not isinstance(buffer, DTensor):
                state[f"buffer:{name}"] = buffer.detach().clone()
    return state


def full_states(rank: int, port: int, out: str) -> None:
    """The full state of the tiny Llama (its `init_weights`) under every `LAYOUTS` entry,
    and of `PlainNet` (`reset_parameters`, seed 0) under FSDP4, all built on meta."""
    _join(rank, port)
    results: dict[str, dict[str, torch.Tensor]] = {}
    for name, sizes in LAYOUTS.items():
        layout = _layout(sizes)
        with torch.device("meta"):
            model = build_llama(LLAMA)
        results[name] = _full_state(_parts(model, layout))
        dist.barrier()
    layout = _layout({})
    with torch.device("meta"):
        plain = PlainNet()
    torch.manual_seed(0)  # the same draws, in module order, as plain_net(0)
    results["plain FSDP4"] = _full_state(_parts(plain, layout))
    torch.save(results, Path(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def data_bytes() -> int:
    """This process's VmData (what RLIMIT_DATA limits), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def capped_training(
    rank: int, port: int, out: str, layout_name: str, meta: bool, extra_bytes: int
) -> None:
    """Train `BIG` for one step under `BIG_LAYOUTS[layout_name]` with this rank's
    RLIMIT_DATA at its VmData after start-up plus `extra_bytes`; built on meta when
    `meta`, else eagerly. Writes {"baseline": B, "cap": B, "ok": bool, "error"/"loss"}."""
    _join(rank, port)
    import air_sdk.runtime.parallel as parallel

    layout = _layout(BIG_LAYOUTS[layout_name])
    parallel.mesh(layout)  # start-up costs (gloo, meshes) are in the baseline
    baseline = data_bytes()
    cap = baseline + extra_bytes
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    results: dict[str, Any] = {"baseline": baseline, "cap": cap}
    try:
        if meta:
            with torch.device("meta"):
                model = build_llama(BIG)
        else:
            model = build_llama(BIG)
        model = _parts(model, layout)[0]
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        tokens, targets = synthetic_batch(BIG, batch_size=1, seq_len=16, step=0)
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        optimizer.step()
        results.update(ok=True, loss=float(loss))
    except (RuntimeError, MemoryError) as exc:  # an allocation over the cap
        # eagerly, every rank fails alike in the build, before any collective
        results.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
    finally:
        results["peak_rss"] = peak_rss()
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    if results["ok"]:
        dist.barrier()
        dist.destroy_process_group()
