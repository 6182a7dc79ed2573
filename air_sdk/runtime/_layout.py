"""The job's parallel layout as one runtime object, as torchtitan's `ParallelDims`.

`air.layout()` is built once per process from the env contract (`RANK`, `WORLD_SIZE`
and `AIR_PARALLELISM`; the process group's rank and size once one exists) and is the
only place that knows:

| what | from the layout |
| --- | --- |
| the mesh | `Layout.mesh()` (dims `pp, dp_replicate, dp_shard, cp, tp`) |
| what data is split by | `dp_rank` of `dp_size` = dp_replicate x dp_shard; the tp, cp and pp ranks of one replica read the same batch |
| the loss-averaging group | `loss_group()`: dp_replicate x dp_shard x cp (`air.dp_mean`) |
| the throughput divisor | `non_data_parallel` = tp x pp x cp: the ranks that share one batch's tokens |
| this rank's pipeline stage | `pp_rank` (with Interleaved1F1B also `pp_rank + pp`) |

Ranks are numbered in mesh order, outermost first, as `init_device_mesh` numbers them,
so a rank's coordinates are plain arithmetic: this module imports no torch (the
throughput meter reads it on the log path); `mesh()` and the groups import it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from air_sdk.errors import ConfigError
from air_sdk.schema.spec import MESH_DIMS, PARALLELISM_ENV, Parallelism
from air_sdk.schema.worker_env import WorkerEnv

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["LOSS_MESH", "Layout", "layout", "resolve_parallelism"]

#: the flattened mesh the loss and gradients are averaged over (torchtitan's name)
LOSS_MESH = "dp_cp"
#: the dims data is split over; the other dims' ranks of one replica share a batch
DATA_DIMS = ("dp_replicate", "dp_shard")
_RANK_VARS = (WorkerEnv.env_name("rank"), WorkerEnv.env_name("world_size"))


def resolve_parallelism(
    world_size: int, parallelism: Parallelism | None = None, env: Mapping[str, str] | None = None
) -> Parallelism:
    """The resolved layout for `world_size` ranks: `parallelism` if given, else the job's
    `AIR_PARALLELISM`, else plain data parallelism (every rank an FSDP rank).

    Raises ConfigError, saying what to change, when the sizes do not multiply to the
    world size or the env holds something else than a layout.

    Example:
        >>> resolve_parallelism(8, Parallelism(tp=2)).sizes()
        {'pp': 1, 'dp_replicate': 1, 'dp_shard': 4, 'cp': 1, 'tp': 2}
    """
    from pydantic import ValidationError

    if parallelism is None:
        raw = (os.environ if env is None else env).get(PARALLELISM_ENV)
        if raw:
            try:
                parallelism = Parallelism.model_validate_json(raw)
            except ValidationError as exc:
                raise ConfigError(
                    f"{PARALLELISM_ENV}={raw!r} is not a layout ({exc.errors()[0]['msg']}):"
                    f" unset it, or give JSON such as '{{\"tp\": 2}}'"
                ) from exc
        else:
            parallelism = Parallelism()
    try:
        return parallelism.resolve(world_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


@dataclass(frozen=True)
class Layout:
    """This rank's place in the job's layout: the one source of the data-parallel rank
    and size, the loss group, the throughput divisor, the pipeline stage and the mesh.

    Example:
        >>> lay = Layout(Parallelism(tp=2, pp=2).resolve(8), rank=5, world_size=8)
        >>> lay.coordinates
        {'pp': 1, 'dp_replicate': 0, 'dp_shard': 0, 'cp': 0, 'tp': 1}
        >>> lay.dp_rank, lay.dp_size, lay.pp_rank, lay.non_data_parallel
        (0, 2, 1, 4)
    """

    parallelism: Parallelism
    """The resolved mesh sizes (`dp_shard` is never -1 here)."""
    rank: int
    """This process's global rank."""
    world_size: int
    """The job's ranks; the sizes multiply to it."""

    def __post_init__(self) -> None:
        sizes = self.parallelism.sizes()
        total = 1
        for size in sizes.values():
            total *= size
        if total != self.world_size or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"layout {sizes} holds {total} ranks, not rank {self.rank} of"
                f" {self.world_size}: resolve it for the world size first"
                " (Parallelism.resolve(world_size))"
            )

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, parallelism: Parallelism | None = None
    ) -> Layout:
        """The layout the launcher's env describes (`RANK`, `WORLD_SIZE`,
        `AIR_PARALLELISM`), or `parallelism` over that world.

        Example:
            >>> Layout.from_env({"RANK": "3", "WORLD_SIZE": "4", "AIR_PARALLELISM": '{"tp": 2}'}).dp_rank
            1
        """
        env = os.environ if env is None else env
        try:
            worker = WorkerEnv.from_env({k: env[k] for k in _RANK_VARS if k in env})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        resolved = resolve_parallelism(worker.world_size, parallelism, env)
        return cls(resolved, rank=worker.rank, world_size=worker.world_size)

    def sizes(self) -> dict[str, int]:
        """{dim: size} in mesh order."""
        return self.parallelism.sizes()

    @property
    def coordinates(self) -> dict[str, int]:
        """This rank's index along every mesh dim (row-major, `pp` outermost)."""
        coords: dict[str, int] = {}
        rest = self.rank
        for dim in reversed(MESH_DIMS):
            size = getattr(self.parallelism, dim)
            coords[dim] = rest % size
            rest //= size
        return {dim: coords[dim] for dim in MESH_DIMS}

    @property
    def dp_size(self) -> int:
        """How many parts each batch is split into: dp_replicate x dp_shard."""
        return self.parallelism.dp_replicate * self.parallelism.dp_shard

    @property
    def dp_rank(self) -> int:
        """Which part of the data this rank reads (the same for every tp, cp and pp rank
        of one replica: a tensor-parallel group, and a pipeline's first and last stage,
        see the same samples)."""
        coords = self.coordinates
        return coords["dp_replicate"] * self.parallelism.dp_shard + coords["dp_shard"]

    @property
    def non_data_parallel(self) -> int:
        """tp x pp x cp: the ranks that share one batch's tokens (what tokens/s and MFU
        divide by)."""
        return self.world_size // self.dp_size

    @property
    def pp_size(self) -> int:
        return self.parallelism.pp

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline stage (its first one with a looped schedule)."""
        return self.coordinates["pp"]

    def check_data_split(self, num_replicas: int, rank: int) -> None:
        """Refuse a data split that disagrees with the layout where that trains wrong: with
        tp, pp or cp > 1 the ranks of one replica must read the same batch.

        Example:
            >>> Layout(Parallelism(tp=2).resolve(4), rank=1, world_size=4).check_data_split(4, 1)
            Traceback (most recent call last):
            ...
            air_sdk.errors.ConfigError: the loader was given rank=1 of num_replicas=4, but under this layout (dp_shard=2 x tp=2) rank 1 reads part 0 of 2: the tp, cp and pp ranks of one replica must read the same batch; drop rank= and num_replicas= (the loader takes them from air.layout()), or pass rank=air.layout().dp_rank, num_replicas=air.layout().dp_size
        """
        if self.non_data_parallel == 1 or (num_replicas, rank) == (self.dp_size, self.dp_rank):
            return
        named = " x ".join(f"{d}={s}" for d, s in self.sizes().items() if s != 1)
        raise ConfigError(
            f"the loader was given rank={rank} of num_replicas={num_replicas}, but under this"
            f" layout ({named}) rank {self.rank} reads part {self.dp_rank} of {self.dp_size}:"
            " the tp, cp and pp ranks of one replica must read the same batch; drop rank="
            " and num_replicas= (the loader takes them from air.layout()), or pass"
            " rank=air.layout().dp_rank, num_replicas=air.layout().dp_size"
        )

    # -- the torch side: built on first use ---------------------------------------------------

    def mesh(self) -> DeviceMesh:
        """The device mesh of this layout (made once per process; joins the process group
        first if nothing did)."""
        from air_sdk.runtime.parallel.meshes import mesh

        return mesh(self.parallelism)

    def submesh(self, name: str) -> DeviceMesh:
        """One dim of the mesh, or a flattened one (`dp`, `dp_shard_cp`, `dp_cp`)."""
        from air_sdk.runtime.parallel.meshes import submesh

        return submesh(name, self.mesh())

    def loss_group(self) -> ProcessGroup:
        """The group the loss is averaged over (dp_replicate x dp_shard x cp)."""
        return self.submesh(LOSS_MESH).get_group()


_lock = threading.Lock()
_cached: tuple[tuple[Any, ...], Layout] | None = None
_chosen: Parallelism | None = None


def _world() -> tuple[int, int] | None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def layout() -> Layout:
    """This process's `Layout`: the process group's rank and size (else `RANK` and
    `WORLD_SIZE`) in the job's `AIR_PARALLELISM` (else plain data parallelism), or the
    layout given to `air.mesh(...)`. The same object on every call while those hold.

    Example:
        >>> import air_sdk.runtime as air
        >>> lay = air.layout()
        >>> batch = dataset[lay.dp_rank :: lay.dp_size]  # doctest: +SKIP
        >>> air.log(step=step, tokens=len(batch) * seq_len)  # doctest: +SKIP
    """
    global _cached
    world = _world()
    env = os.environ
    key = (world, _chosen, *(env.get(name) for name in (*_RANK_VARS, PARALLELISM_ENV)))
    with _lock:
        if _cached is not None and _cached[0] == key:
            return _cached[1]
        if world is None:
            built = Layout.from_env(env, _chosen)
        else:
            rank, size = world
            built = Layout(resolve_parallelism(size, _chosen), rank=rank, world_size=size)
        _cached = (key, built)
        return built


def chosen() -> Parallelism | None:
    """The layout `air.mesh(layout)` made the process's, if one did."""
    return _chosen


def _choose(parallelism: Parallelism | None) -> None:
    """`air.mesh(layout)` was given a layout: it is the process's from now on (None:
    back to the env's; tests that re-create the process group)."""
    global _chosen, _cached
    with _lock:
        _chosen = parallelism
        _cached = None
