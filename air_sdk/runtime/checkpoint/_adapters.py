"""State adapters: what DCP sees for each entry of the state passed to `save` / `load`.

A module (plain, DDP, FSDP2, tensor-parallel, compiled, activation-checkpointed) goes
through `torch.distributed.checkpoint.state_dict`: its keys are the parameter names of
the unwrapped model (no `module.`, `_orig_mod.`, `_checkpoint_wrapped_module.`), and a
sharded parameter stays a DTensor, so DCP writes each rank's shards with the tensor's
global shape and, on load, reads whatever pieces the DTensors of the *new* layout
need: a checkpoint saved under FSDP(4) loads under TP(2) x FSDP(2), on 2 ranks or in
one process. A list of modules is the model parts one rank holds (pipeline stages,
as torchtitan keeps them: each part keeps the full model's FQNs), saved as one
flat dict of FQNs, so a different number of stages can load it. An optimizer (or a
list, one per part) is saved per parameter FQN with DCP's
`flatten_optimizer_state_dict`, so its state reshards the same way and stages with
different parameters never collide on a key.

Example:
    >>> stateful({"epoch": 3})
    {'epoch': 3}
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from air_sdk.errors import CheckpointError

if TYPE_CHECKING:
    import torch

__all__ = [
    "KINDS",
    "ModelState",
    "OptimizerState",
    "data_position",
    "describe_layout",
    "layout",
    "state_kinds",
    "stateful",
]

#: What `state_kinds` calls an entry (recorded in the manifest, read by the exporter).
KINDS = ("model", "optimizer", "stateful", "value")


def _options(*, strict: bool = True, flat: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(strict=strict, flatten_optimizer_state_dict=flat)


class ModelState:
    """One module, or the parts of one model this rank holds (pipeline stages), as one
    dict of FQNs; FSDP2 / TP parameters stay DTensors, so DCP can reshard them."""

    def __init__(self, parts: Sequence[torch.nn.Module]) -> None:
        self.parts = list(parts)

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        merged: dict[str, Any] = {}
        for part in self.parts:
            for fqn, value in get_model_state_dict(part).items():
                if fqn in merged:
                    raise CheckpointError(
                        f"two model parts both hold {fqn!r}: pipeline stages must keep the"
                        " full model's names for their own layers only"
                    )
                merged[fqn] = value
        return merged

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        if len(self.parts) == 1:
            set_model_state_dict(self.parts[0], state)
            return
        for part in self.parts:  # each takes its own names; DCP loaded exactly these
            set_model_state_dict(part, state, options=_options(strict=False))


class OptimizerState:
    """Optimizers keyed by parameter FQN (one per model part where there are several);
    their lazily created state is made first, so loading into a fresh one works.

    `flat=False` reads checkpoints of AIR before it saved optimizers flattened (their
    manifest has no `state_kinds`)."""

    def __init__(
        self, pairs: Sequence[tuple[torch.nn.Module, torch.optim.Optimizer]], *, flat: bool = True
    ) -> None:
        self.pairs = list(pairs)
        self.flat = flat

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        if not self.flat:
            (model, optimizer), *_ = self.pairs
            return get_optimizer_state_dict(model, optimizer)
        merged: dict[str, Any] = {}
        for model, optimizer in self.pairs:
            merged.update(get_optimizer_state_dict(model, optimizer, options=_options()))
        return merged

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        for model, optimizer in self.pairs:  # each picks its parameters' keys
            set_optimizer_state_dict(model, optimizer, state, options=_options(flat=self.flat))


def _modules(value: Any) -> list[torch.nn.Module] | None:
    """The module, or the model parts of a non-empty list/tuple of modules; else None."""
    import torch

    if isinstance(value, torch.nn.Module):
        return [value]
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, torch.nn.Module) for v in value)
    ):
        return list(value)
    return None


def _optimizers(value: Any) -> list[torch.optim.Optimizer] | None:
    import torch

    if isinstance(value, torch.optim.Optimizer):
        return [value]
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, torch.optim.Optimizer) for v in value)
    ):
        return list(value)
    return None


def _check_keys(state: Any) -> None:
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise TypeError("the checkpoint state must be a dict with string keys")


def stateful(state: Mapping[str, Any], *, flat_optimizers: bool = True) -> dict[str, Any]:
    """What DCP sees: modules and optimizers wrapped in adapters, everything else as it is.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> wrapped = stateful({"model": model, "optim": torch.optim.SGD(model.parameters())})
        >>> sorted(type(v).__name__ for v in wrapped.values())
        ['ModelState', 'OptimizerState']
    """
    _check_keys(state)
    parts = {k: m for k, v in state.items() if (m := _modules(v)) is not None}
    out: dict[str, Any] = {}
    for key, value in state.items():
        optimizers = _optimizers(value)
        if key in parts:
            out[key] = ModelState(parts[key])
        elif optimizers is not None:
            pairs = [(_owner(key, o, parts), o) for o in optimizers]
            if not flat_optimizers and len(pairs) > 1:
                raise CheckpointError(
                    f"state[{key!r}]: this checkpoint predates lists of optimizers; load it"
                    " with one optimizer"
                )
            out[key] = OptimizerState(pairs, flat=flat_optimizers)
        else:
            out[key] = value
    return out


def _owner(
    key: str, optimizer: torch.optim.Optimizer, parts: Mapping[str, list[torch.nn.Module]]
) -> torch.nn.Module:
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for modules in parts.values():
        for module in modules:
            if wanted <= {id(p) for p in module.parameters()}:
                return module
    if any(len(modules) > 1 for modules in parts.values()):
        raise CheckpointError(
            f"state[{key!r}] optimizes parameters that no single model part holds: give each"
            " part (pipeline stage) its own optimizer and pass the list, e.g."
            " state['optim'] = [optim_0, optim_1]"
        )
    raise CheckpointError(
        f"state[{key!r}] optimizes parameters that no module in the state holds: "
        "put the model in the state too, e.g. state['model'] = model"
    )


def state_kinds(state: Mapping[str, Any]) -> dict[str, str]:
    """What each entry is (`KINDS`): the manifest records it, so an exporter knows which
    keys are models without the training code.

    Example:
        >>> import torch
        >>> state_kinds({"model": torch.nn.Linear(2, 2), "epoch": 1})
        {'model': 'model', 'epoch': 'value'}
    """
    from torch.distributed.checkpoint.stateful import Stateful

    kinds = {}
    for key, value in state.items():
        if _modules(value) is not None:
            kinds[key] = "model"
        elif _optimizers(value) is not None:
            kinds[key] = "optimizer"
        elif isinstance(value, Stateful):
            kinds[key] = "stateful"
        else:
            kinds[key] = "value"
    return kinds


def data_position(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `state_dict()` of every resumable loader / sampler / sharded dataset in `state`
    (None: none). A `ShardedDataset`'s agrees its position across ranks: every rank calls
    this, as every rank saves."""
    data = sys.modules.get("air_sdk.runtime.data")
    if data is None:  # nothing can hold a data position without that module
        return None
    kinds = data.position_holders()
    found = {k: v.state_dict() for k, v in state.items() if kinds and isinstance(v, kinds)}
    return found or None


def layout(state: Mapping[str, Any] | None = None) -> dict[str, int] | None:
    """The parallel layout this process trains under, as mesh sizes: `air.layout()`'s
    when the job's `AIR_PARALLELISM` (set by AIR's runner) or `air.mesh(Parallelism(...))`
    gave one, else the dimensions of the device meshes
    of the DTensor parameters in `state` (a pipeline dimension is not seen that way),
    else None.

    Example:
        >>> os.environ["AIR_PARALLELISM"] = '{"dp_shard": 2, "tp": 2}'
        >>> layout()
        {'pp': 1, 'dp_replicate': 1, 'dp_shard': 2, 'cp': 1, 'tp': 2}
        >>> del os.environ["AIR_PARALLELISM"]
    """
    from air_sdk.errors import ConfigError
    from air_sdk.runtime import _layout
    from air_sdk.schema.spec import PARALLELISM_ENV, Parallelism

    raw = os.environ.get(PARALLELISM_ENV, "").strip()
    if raw or _layout.chosen() is not None:  # the process's Layout (pp included)
        try:
            return _layout.layout().sizes()
        except ConfigError:
            pass  # a layout for another world size than this process's: as the env says
    if raw:
        try:
            return Parallelism.model_validate(json.loads(raw)).sizes()
        except ValueError as exc:
            raise CheckpointError(f"{PARALLELISM_ENV}={raw!r} is not a layout: {exc}") from None
    found: dict[str, int] = {}
    for value in (state or {}).values():
        for module in _modules(value) or ():
            found.update(_mesh_dims(module))
    return _in_mesh_order(found) if found else None


def _in_mesh_order(sizes: Mapping[str, int]) -> dict[str, int]:
    from air_sdk.schema.spec import MESH_DIMS

    order = {name: i for i, name in enumerate(MESH_DIMS)}
    return dict(sorted(sizes.items(), key=lambda item: order.get(item[0], len(order))))


def _mesh_dims(module: torch.nn.Module) -> dict[str, int]:
    """{dimension name: size} over the meshes of the module's DTensor parameters."""
    from torch.distributed.tensor import DTensor

    dims: dict[str, int] = {}
    meshes: set[int] = set()
    for param in module.parameters():
        if isinstance(param, DTensor) and id(param.device_mesh) not in meshes:
            mesh = param.device_mesh
            meshes.add(id(mesh))
            names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
            dims.update(zip(names, (int(n) for n in mesh.shape), strict=True))
    return dims


def describe_layout(sizes: Mapping[str, int] | None, world_size: int) -> str:
    """A layout as a line says it: the sizes other than 1, and the ranks.

    Example:
        >>> describe_layout({"tp": 2, "pp": 1, "dp_shard": 2}, 4)
        'dp_shard=2 x tp=2 (4 ranks)'
        >>> describe_layout(None, 1)
        'an unrecorded layout (1 rank)'
    """
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    if sizes is None:
        return f"an unrecorded layout ({ranks})"
    named = [f"{k}={v}" for k, v in _in_mesh_order(sizes).items() if v != 1]
    return f"{' x '.join(named) or 'no parallelism'} ({ranks})"
