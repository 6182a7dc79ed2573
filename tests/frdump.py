"""A gloo job whose last rank skips one collective, each rank writing its real flight
recorder dump (`torch._C._distributed_c10d._dump_fr_trace`) as `rank_<R>`: the data
`air_sdk.runner.collectives` reads, straight from torch."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

WORLD = 3


def run(rank: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100"  # before torch makes the process group
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=30)
    )
    tensor = torch.ones(16)
    for _ in range(3):
        dist.all_reduce(tensor)
    # the last rank never calls the fourth all-reduce; the others start it and wait
    if rank != WORLD - 1:
        dist.all_reduce(tensor, async_op=True)
    Path(out, f"rank_{rank}").write_bytes(_dump_fr_trace())
    os._exit(0)  # the pending all-reduce can never finish: leave without waiting for it
