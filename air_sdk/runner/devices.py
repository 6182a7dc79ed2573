"""What this machine has: GPUs (nvidia-ml-py) and CPU cores, split into virtual nodes."""

from __future__ import annotations

import os
from dataclasses import dataclass

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
    num_nodes: int, slots_per_node: int | None = None, gpus: list[Gpu] | None = None
) -> list[NodeSpec]:
    """Split this machine into `num_nodes` virtual nodes.

    GPUs are dealt out evenly (node i gets a contiguous block); without GPUs each
    node gets `slots_per_node` rank slots, by default the cores divided evenly
    (at least 1), so a 2-node job on a 2-core laptop fits exactly once.

    Example:
        >>> [n.slots for n in local_virtual_nodes(2, gpus=[])] == [max(1, (os.cpu_count() or 1) // 2)] * 2
        True
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes}: a gateway needs at least 1 node")
    gpus = detect_gpus() if gpus is None else gpus
    per_node_gpus = len(gpus) // num_nodes if gpus else 0
    cores = os.cpu_count() or 1
    # what the machine has, so a job that can never fit is told the flag that resizes it
    machine = {MACHINE_CORES_LABEL: str(cores), MACHINE_GPUS_LABEL: str(len(gpus))}
    nodes = []
    for i in range(num_nodes):
        block = tuple(g.index for g in gpus[i * per_node_gpus : (i + 1) * per_node_gpus])
        default_slots = len(block) or max(1, cores // num_nodes)
        nodes.append(
            NodeSpec(
                name=f"node-{i}", slots=slots_per_node or default_slots, gpus=block, labels=machine
            )
        )
    return nodes
