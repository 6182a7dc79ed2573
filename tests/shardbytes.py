"""What each rank really holds under a layout: the local bytes of its parameters, their
gradients and AdamW's state (`to_local()` of every DTensor), measured by a real gloo job.

`run(rank, ...)` is a `torch.multiprocessing` target: it builds `tinyllama.TinyLlama`,
lays it out for each of `LAYOUTS` (with torch's FSDP2 / tensor-parallel APIs directly, or
with `air_sdk.runtime.parallel` when `use_air`), runs one step and writes
`rank<R>.json`: {layout: {"stage": s, "params": B, "grads": B, "optimizer": B}}.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tinyllama import TinyLlama, loss_of, shape

from air_sdk.schema import Parallelism

SHAPE = shape(layers=4, hidden=64, heads=4, kv=2, vocab=96, ffn=160)
SEQ = 16
WORLD = 4
#: name -> Parallelism sizes over 4 ranks
LAYOUTS = {
    "DDP4": {"dp_replicate": 4, "dp_shard": 1},
    "FSDP4": {},
    "HSDP 2x2": {"dp_replicate": 2},
    "TP2 × FSDP2": {"tp": 2},
    "PP2 × FSDP2": {"pp": 2},
}


def _local_bytes(t: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def _tp_plan() -> dict:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(SHAPE.num_layers):
        for name in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "feed_forward.w1",
            "feed_forward.w3",
        ):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("attention.wo", "feed_forward.w2"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    return plan


class _Stage(nn.Module):
    """Half of the blocks; the first stage has the embedding, the last the norm and output."""

    def __init__(self, model: TinyLlama, stage: int) -> None:
        super().__init__()
        half = SHAPE.num_layers // 2
        self.first = stage == 0
        self.layers = nn.ModuleList(model.layers[:half] if self.first else model.layers[half:])
        self.tok_embeddings = model.tok_embeddings if self.first else None
        self.norm = None if self.first else model.norm
        self.output = None if self.first else model.output
        self.register_buffer("freqs", model.freqs, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers:
            h = layer(h, self.freqs[: h.shape[1]])
        if self.output is None:
            return h
        return self.output(self.norm(h))


def _build(layout: Parallelism, use_air: bool) -> tuple[nn.Module, int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)  # the same weights on every rank
    model = TinyLlama(SHAPE, seq=SEQ)
    if use_air:
        import air_sdk.runtime.parallel as parallel

        mesh = parallel.mesh(layout)
        return parallel.parallelize(model, mesh=mesh, mixed_precision="fp32"), 0
    if layout.dp_replicate == WORLD:
        return nn.parallel.DistributedDataParallel(model), 0
    if layout.pp > 1:
        mesh = init_device_mesh("cpu", (layout.pp, layout.dp_shard), mesh_dim_names=("pp", "dp"))
        stage = mesh.get_local_rank("pp")
        module: nn.Module = _Stage(model, stage)
        dp_mesh = mesh["dp"]
    elif layout.tp > 1:
        mesh = init_device_mesh("cpu", (layout.dp_shard, layout.tp), mesh_dim_names=("dp", "tp"))
        module, stage, dp_mesh = parallelize_module(model, mesh["tp"], _tp_plan()), 0, mesh["dp"]
    elif layout.dp_replicate > 1:
        dp_mesh = init_device_mesh(
            "cpu", (layout.dp_replicate, layout.dp_shard), mesh_dim_names=("replicate", "shard")
        )
        module, stage = model, 0
    else:
        module, stage, dp_mesh = model, 0, init_device_mesh("cpu", (WORLD,))
    for layer in module.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(module, mesh=dp_mesh)
    return module, stage


def _measure(layout: Parallelism, use_air: bool) -> dict[str, int]:
    module, stage = _build(layout, use_air)
    params = [p for p in module.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SHAPE.vocab_size, (2, SEQ), generator=generator)
    if layout.pp > 1 and stage == 0:
        module(tokens).square().mean().backward()
    elif layout.pp > 1:
        hidden = torch.randn(2, SEQ, SHAPE.hidden_size, generator=generator)
        F.cross_entropy(module(hidden).flatten(0, 1), tokens.flatten()).backward()
    else:
        loss_of(module, tokens).backward()
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    optimizer.step()
    states = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]
    return {
        "stage": stage,
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(_local_bytes(v) for v in states),
    }


def run(rank: int, port: int, out: str, use_air: bool) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    results = {}
    for name, sizes in LAYOUTS.items():
        layout = Parallelism(**sizes).resolve(WORLD)
        if use_air and layout.pp > 1:
            continue  # a pipeline's stages are built by air.pipeline; measured directly above
        os.environ["AIR_PARALLELISM"] = layout.model_dump_json()
        results[name] = _measure(layout, use_air)
        dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
