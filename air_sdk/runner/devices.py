"""What this machine has: GPUs (nvidia-ml-py) and CPU cores, split into virtual nodes."""

from __future__ import annotations

import os
from dataclasses import dataclass

from air_sdk.runner.machine import MACHINE_MAX_RANKS_LABEL
from air_sdk.scheduler import MACHINE_CORES_LABEL, MACHINE_GPUS_LABEL, NodeSpec


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int


def detect_gpus() -> list[Gpu]:
    """GPUs visible through NVML; an empty list without a driver (the common CPU case)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []  # NVMLError_LibraryNotFound on machines without a driver
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1 << 20)
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else name, int(mem)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def local_virtual_nodes(
    num_nodes: int,
    slots_per_node: int | None = None,
    gpus: list[Gpu] | None = None,
    *,
    oversubscribe: bool = False,
    cores: int | None = None,
) -> list[NodeSpec]:
    """Split this machine into `num_nodes` virtual nodes.

    GPUs are dealt out evenly (node i gets a contiguous block). Without GPUs each node
    offers `slots_per_node` rank slots, by default every core of the machine, and the
    nodes share the cores: `MACHINE_MAX_RANKS_LABEL` caps the ranks all of them run at
    once at the core count (`air_sdk.runner.machine`). So on a 2-core laptop a 1-node x
    2-rank job and a 2-node x 1-rank job both fit, one at a time. `oversubscribe` (or a
    `slots_per_node` whose total is above the cores) lifts the cap: ranks beyond the
    cores share them. `cores` defaults to `os.cpu_count()`.

    Example:
        >>> nodes = local_virtual_nodes(2, gpus=[], cores=2)
        >>> [n.slots for n in nodes], nodes[0].labels[MACHINE_MAX_RANKS_LABEL]
        ([2, 2], '2')
        >>> MACHINE_MAX_RANKS_LABEL in local_virtual_nodes(2, gpus=[], cores=2, oversubscribe=True)[0].labels
        False
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes}: a gateway needs at least 1 node")
    gpus = detect_gpus() if gpus is None else gpus
    per_node_gpus = len(gpus) // num_nodes if gpus else 0
    cores = cores or os.cpu_count() or 1
    # what the machine has, so a job that can never fit is told the flag that resizes it
    machine = {MACHINE_CORES_LABEL: str(cores), MACHINE_GPUS_LABEL: str(len(gpus))}
    capped = (
        not per_node_gpus
        and not oversubscribe
        and (slots_per_node is None or slots_per_node * num_nodes <= cores)
    )
    nodes = []
    for i in range(num_nodes):
        block = tuple(g.index for g in gpus[i * per_node_gpus : (i + 1) * per_node_gpus])
        labels = dict(machine)
        if capped:
            labels[MACHINE_MAX_RANKS_LABEL] = str(cores)
        nodes.append(
            NodeSpec(
                name=f"node-{i}",
                slots=slots_per_node or len(block) or cores,
                gpus=block,
                labels=labels,
            )
        )
    return nodes
