"""The device mesh of the job's layout, built once per process.

The layout is the process's `air.layout()` (`air_sdk.runtime._layout`): from
`AIR_PARALLELISM` (the runner resolves `JobSpec.parallelism` and passes it to every
rank), from an argument outside AIR (`mesh(Parallelism(...))`, which then becomes the
process's layout), or plain data parallelism over `WORLD_SIZE`. The mesh has the dims `pp, dp_replicate, dp_shard, cp, tp`
(outermost first, so a tensor-parallel group is consecutive ranks, inside one node) and
the flattened data-parallel meshes torchtitan uses: `dp` (dp_replicate x dp_shard: how
the batch is split), `dp_shard_cp` (dp_shard x cp: what FSDP shards over) and `dp_cp`
(dp_replicate x dp_shard x cp: what the loss and gradients are averaged over).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from air_sdk.errors import ConfigError
from air_sdk.runtime._layout import LOSS_MESH, Layout, _choose, resolve_parallelism
from air_sdk.runtime._layout import layout as process_layout
from air_sdk.schema import MESH_DIMS, Parallelism

__all__ = [
    "FLATTENED_DIMS",
    "dp_mean",
    "layout_object",
    "layout_of",
    "mesh",
    "mesh_device",
    "read_layout",
    "submesh",
]

#: Flattened data-parallel meshes: name -> the mesh dims it spans (torchtitan's names).
FLATTENED_DIMS: dict[str, tuple[str, ...]] = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


@dataclass
class _Record:
    root: DeviceMesh
    layout: Parallelism
    runtime_layout: Layout
    flattened: dict[str, DeviceMesh] = field(default_factory=dict)


_lock = threading.Lock()
_by_layout: dict[Parallelism, _Record] = {}
_by_mesh: dict[int, _Record] = {}
_current: _Record | None = None


def read_layout(world_size: int, layout: Parallelism | None = None) -> Parallelism:
    """The resolved layout for `world_size` ranks: `layout` if given, else the job's
    `AIR_PARALLELISM`, else plain data parallelism (every rank an FSDP rank); see
    `air_sdk.runtime._layout.resolve_parallelism`.

    Example:
        >>> read_layout(8, Parallelism(tp=2)).sizes()
        {'pp': 1, 'dp_replicate': 1, 'dp_shard': 4, 'cp': 1, 'tp': 2}
    """
    return resolve_parallelism(world_size, layout)


def mesh(layout: Parallelism | None = None) -> DeviceMesh:
    """The `DeviceMesh` of this job's layout, with dims `pp, dp_replicate, dp_shard, cp,
    tp` and the flattened `dp`, `dp_shard_cp`, `dp_cp` (see `submesh`).

    Joins the process group first (`air.init()`) if nothing did. Without `layout`:
    the mesh made earlier in this process, else the job's `AIR_PARALLELISM`, else
    plain data parallelism over `WORLD_SIZE`. The same layout gives the same mesh
    object every time. Device type "cuda" when the group is NCCL, else "cpu" (gloo).

    Example:
        >>> import air_sdk.runtime as air
        >>> m = air.mesh()  # doctest: +SKIP
        >>> m["tp"].size(), air.submesh("dp").get_local_rank()  # doctest: +SKIP
        (2, 0)
    """
    global _current
    if not dist.is_initialized():
        from air_sdk.runtime._dist import init

        init()
    with _lock:
        if layout is None and _current is not None:
            return _current.root
        if layout is not None:  # the process's layout from now on (air.layout() says it)
            _choose(read_layout(dist.get_world_size(), layout))
        the_layout = process_layout()
        resolved = the_layout.parallelism
        record = _by_layout.get(resolved)
        if record is None:
            record = _build(the_layout)
            _by_layout[resolved] = record
            _by_mesh[id(record.root)] = record
        _current = record
        return record.root


def _build(the_layout: Layout) -> _Record:
    layout = the_layout.parallelism
    sizes = layout.sizes()
    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    root = init_device_mesh(
        device_type, tuple(sizes[d] for d in MESH_DIMS), mesh_dim_names=MESH_DIMS
    )
    record = _Record(root=root, layout=layout, runtime_layout=the_layout)
    # Flattened once here and kept: slicing a flattened name from the root is deprecated.
    for name, dims in FLATTENED_DIMS.items():
        record.flattened[name] = root[dims]._flatten(name)
    return record


def _record_of(mesh_: DeviceMesh | None) -> _Record:
    if mesh_ is None:
        mesh_ = mesh()
    record = _by_mesh.get(id(mesh_))
    if record is None or record.root is not mesh_:
        raise ConfigError(
            "this DeviceMesh was not made by air.mesh(): pass the mesh air.mesh() returns"
        )
    return record


def submesh(name: str, mesh_: DeviceMesh | None = None) -> DeviceMesh:
    """One dim of the mesh as a 1-D mesh: a plain dim (`pp`, `dp_replicate`, `dp_shard`,
    `cp`, `tp`) or a flattened one: `dp` (split the batch by its rank and size),
    `dp_shard_cp` (FSDP's), `dp_cp` (average the loss over it).

    Example:
        >>> import air_sdk.runtime as air
        >>> dp = air.submesh("dp")  # doctest: +SKIP
        >>> rows = batch[dp.get_local_rank() :: dp.size()]  # doctest: +SKIP
    """
    record = _record_of(mesh_)
    if name in record.flattened:
        return record.flattened[name]
    if name in MESH_DIMS:
        return record.root[name]
    known = ", ".join([*MESH_DIMS, *FLATTENED_DIMS])
    raise ConfigError(f"no mesh dim {name!r}: use one of {known}")


def layout_of(mesh_: DeviceMesh | None = None) -> Parallelism:
    """The resolved layout a mesh from `mesh()` was made for.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.parallel.layout_of().tp  # doctest: +SKIP
        2
    """
    return _record_of(mesh_).layout


def layout_object(mesh_: DeviceMesh | None = None) -> Layout:
    """The runtime `Layout` (this rank's coordinates too) a mesh from `mesh()` was made
    for: where a pipeline reads its stage.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.parallel.meshes.layout_object().pp_rank  # doctest: +SKIP
        0
    """
    return _record_of(mesh_).runtime_layout


def mesh_device(mesh_: DeviceMesh) -> torch.device:
    """This rank's device on the mesh: `cuda:LOCAL_RANK` on NCCL meshes, else cpu."""
    if mesh_.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def dp_mean(value: Any, mesh_: DeviceMesh | None = None) -> float:
    """The mean of a number (a loss) over the data-parallel ranks (`dp_cp`): the value
    to log, the same on every rank. Ranks of one tensor-parallel or pipeline group
    hold the same loss already (`Pipeline.step` broadcasts it), so they agree too.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.log(step=step, loss=air.dp_mean(loss))  # doctest: +SKIP
    """
    group_mesh = submesh(LOSS_MESH, mesh_)
    tensor = torch.as_tensor(
        value.detach() if isinstance(value, torch.Tensor) else value, dtype=torch.float32
    )
    tensor = tensor.to(mesh_device(group_mesh)).reshape(())
    if group_mesh.size() > 1:
        dist.all_reduce(tensor, group=group_mesh.get_group())
        tensor = tensor / group_mesh.size()
    return float(tensor)


def _forget_meshes() -> None:
    """Drop the cached meshes (tests that destroy and re-create the process group)."""
    global _current
    with _lock:
        _by_layout.clear()
        _by_mesh.clear()
        _current = None
    _choose(None)
