"""Replicas that agree: after sharding, refuse a model whose copies differ across ranks.

FSDP2 shards what each rank holds and never broadcasts, so HSDP replicas (the
`dp_replicate` dim), the copies tensor parallelism keeps whole on every tp rank (norms
under sequence parallelism, parameters no plan splits) and DDP-style replicas of a
model built without a common seed start apart and train apart forever, with no error
and a loss that still falls. The check is cheap: per parameter, the float64 sum and
absolute sum of this rank's local shard, all-reduced MIN and MAX over each group the
parameter is replicated over (two small all-reduces per group), then one flag over
the world so every rank refuses together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from air_sdk.errors import ConfigError
from air_sdk.runtime.parallel.meshes import layout_of, mesh_device, submesh

__all__ = ["check_replicas"]

# Equal copies give equal sums to the last bit; unseeded ones differ in the first digits.
_RTOL = 1e-9


@dataclass
class _Group:
    group: dist.ProcessGroup
    dim: str
    names: list[str] = field(default_factory=list)
    stats: list[torch.Tensor] = field(default_factory=list)


def check_replicas(parts: nn.Module | Iterable[nn.Module], mesh: DeviceMesh) -> None:
    """Raise ConfigError, on every rank, when a parameter that should be one copy on the
    ranks of a replicate dim (HSDP's `dp_replicate`, a tensor-parallel `Replicate`,
    an unsharded parameter under tp) holds other values on some of them. Parameters
    still on the meta device are skipped (they have no values yet).

    Example:
        >>> model = air.parallelize(build_model())  # doctest: +SKIP
        >>> check_replicas(model, air.mesh())  # doctest: +SKIP  (parallelize already did)
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    modules = [parts] if isinstance(parts, nn.Module) else list(parts)
    groups: dict[tuple[object, ...], _Group] = {}
    for module in modules:
        for name, param in module.named_parameters():
            for key, group, dim in _replicate_groups(param, mesh):
                entry = groups.setdefault(key, _Group(group, dim))
                local = param.to_local() if isinstance(param, DTensor) else param
                if local.is_meta:
                    continue
                data = local.detach().to(torch.float64)
                entry.names.append(name)
                entry.stats.append(torch.stack([data.sum(), data.abs().sum()]))
    problem = ""
    for entry in groups.values():  # the same order on every rank: the model's own
        found = _compare(entry, mesh)  # every group's collectives run, found or not
        problem = problem or found
    flag = torch.tensor([1.0 if problem else 0.0], device=mesh_device(mesh))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        raise ConfigError(
            (
                problem
                or "the model's replicas differ on other ranks (their error names the parameter)"
            )
            + ": the model was built with unseeded initialization (each rank drew its own"
            " random weights), and FSDP2 does not broadcast, so the replicas would train"
            " apart with no error; call torch.manual_seed(...) with the same seed before"
            " building the model on every rank, or build it on the meta device"
            " (with torch.device('meta'): ...) and initialize it after parallelizing"
        )


def _replicate_groups(
    param: torch.Tensor, mesh: DeviceMesh
) -> list[tuple[tuple[object, ...], dist.ProcessGroup, str]]:
    """(key, group, dim name) of each group of more than one rank that must hold the same
    copy of `param`."""
    if isinstance(param, DTensor):
        pmesh = param.device_mesh
        names = pmesh.mesh_dim_names or tuple(f"dim{i}" for i in range(pmesh.ndim))
        return [
            (("dtensor", id(pmesh), i), pmesh.get_group(i), names[i])
            for i, placement in enumerate(param.placements)
            if placement.is_replicate() and pmesh.size(i) > 1
        ]
    # A plain parameter is whole on every rank of its stage: one copy per pp coordinate.
    sizes = layout_of(mesh).sizes()
    return [
        (("plain", dim), submesh(dim, mesh).get_group(), dim)
        for dim in ("dp_replicate", "dp_shard", "cp", "tp")
        if sizes[dim] > 1
    ]


def _compare(entry: _Group, mesh: DeviceMesh) -> str:
    if not entry.stats:
        return ""
    low = torch.stack(entry.stats).to(mesh_device(mesh))
    high = low.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=entry.group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=entry.group)
    differs = ((high - low).abs() > _RTOL * high[:, 1:].abs()).any(dim=1)
    if not bool(differs.any()):
        return ""
    name = entry.names[int(differs.nonzero()[0])]
    ranks = dist.get_process_group_ranks(entry.group)
    return (
        f"the model's replicas differ: parameter {name!r} should be one copy on the ranks"
        f" of {entry.dim} (global ranks {ranks}), but holds other values on some of them"
    )
