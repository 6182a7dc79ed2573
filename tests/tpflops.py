"""Two gloo ranks run a tensor-parallel MLP under the runtime's FLOP counter and write
what each counted (`rank<R>.json`: forward and hardware FLOPs)."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

BATCH, WIDTH, HIDDEN = 16, 64, 256


def run(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from air_sdk.runtime._flops import StepFlopCounter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, WIDTH, bias=False),
    )
    parallelize_module(
        model, init_device_mesh("cpu", (2,)), {"0": ColwiseParallel(), "2": RowwiseParallel()}
    )
    with StepFlopCounter() as counter:
        model(torch.randn(BATCH, WIDTH)).sum().backward()
    Path(out, f"rank{rank}.json").write_text(
        json.dumps([counter.forward_flops, counter.hardware_flops])
    )
    dist.destroy_process_group()
