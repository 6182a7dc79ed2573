"""Models built on the meta device: each rank materializes only its own shards and
initializes them (torchtitan's order: meta init -> TP -> AC -> compile -> FSDP ->
`to_empty` -> init).

```python
with torch.device("meta"):
    model = Model(cfg)              # no memory: shapes only
model = air.parallelize(model)      # shards, then this rank's shards are allocated and set
```

How the shards get their values, in this order of preference:

1. the model's own `init_weights()` (torchtitan's convention), called once on the
   sharded model. It sees DTensor parameters; `fill_from_full(param, full)` copies the
   local part of a full-size tensor it made, so it can draw every tensor whole from a
   seeded generator and start every layout from the 1-rank weights (the tiny Llama in
   `air_sdk.examples.llama` does this);
2. a Hugging Face model's `_init_weights(module)`, per module;
3. each module's `reset_parameters()` (torch's convention), per module.

In 2 and 3 the module's initializer runs on full-size plain tensors (one module at a
time) and each rank keeps its own part: every rank draws the same random numbers, in
module order, as a 1-rank build does, so under the same seed every layout starts from
the same weights (exactly, when the 1-rank build initializes its modules in the same
order). Memory: one module's full tensors at a time.

Every floating parameter and buffer is filled with NaN (integers with their minimum)
before; any still holding that after the initializer is refused by name with the fix
(a non-persistent buffer computed in `__init__`, like a rotary table, is lost on meta:
recompute it in `init_weights()`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor

from air_sdk.errors import ConfigError

__all__ = ["fill_from_full", "is_meta_model", "materialize"]

_PARAM_HINT = (
    "give the model an init_weights() method that sets every parameter and buffer"
    " (torchtitan's convention), or each such module a reset_parameters(); or build the"
    " model on the real device instead of meta"
)


def is_meta_model(model: nn.Module) -> bool:
    """True when every parameter of `model` is on the meta device, False when none is.

    Raises ConfigError when only some are (`to_empty` would wipe the others).

    Example:
        >>> with torch.device("meta"):
        ...     layer = nn.Linear(2, 2)
        >>> is_meta_model(layer), is_meta_model(nn.Linear(2, 2))
        (True, False)
    """
    params = dict(model.named_parameters())
    meta = [name for name, p in params.items() if p.is_meta]
    if meta and len(meta) < len(params):
        real = sorted(set(params) - set(meta))
        raise ConfigError(
            f"{type(model).__name__} has {len(meta)} parameters on the meta device and"
            f" {len(real)} elsewhere (e.g. {real[0]}): build the whole model under"
            ' `with torch.device("meta"):` or none of it'
        )
    return bool(meta)


def fill_from_full(tensor: torch.Tensor, full: torch.Tensor) -> None:
    """Set `tensor` (a parameter or buffer, plain or a DTensor shard) from `full`, the
    whole tensor: a DTensor keeps only its local part. For `init_weights()` methods
    that draw each tensor whole, so that every layout starts from the same weights.

    Example:
        >>> weight = torch.empty(2, 2)
        >>> fill_from_full(weight, torch.ones(2, 2))
        >>> float(weight.sum())
        4.0
    """
    if tuple(full.shape) != tuple(tensor.shape):
        raise ConfigError(
            f"fill_from_full: the full tensor has shape {tuple(full.shape)}, the parameter"
            f" {tuple(tensor.shape)}: pass the whole (unsharded) tensor"
        )
    with torch.no_grad():
        if isinstance(tensor, DTensor):
            local = _local(tensor)
            part = distribute_tensor(
                full.to(local.device, local.dtype),
                tensor.device_mesh,
                tensor.placements,
                src_data_rank=None,  # every rank holds `full`: slice, do not scatter
            ).to_local()
            local.copy_(part)
        else:
            tensor.copy_(full)


def materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate this rank's shards of a meta-built `model` on `device` and initialize
    them (see the module docstring for how). Called by `parallelize`/`pipeline` after
    TP, AC, compile and FSDP; raises ConfigError naming what no initializer set."""
    model.to_empty(device=device)
    _poison(model)
    with torch.no_grad():
        init_weights = getattr(model, "init_weights", None)
        hf_init = getattr(model, "_init_weights", None)
        if _is_hf_model(model) and callable(hf_init):
            for module in _post_order(model):
                _run_on_full(module, hf_init)
        elif callable(init_weights):
            init_weights()
        else:
            for module in model.modules():
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    _run_on_full(module, lambda m: m.reset_parameters())  # type: ignore[operator]
    _refuse_unset(model)


def _is_hf_model(model: nn.Module) -> bool:
    return any(cls.__name__ == "PreTrainedModel" for cls in type(model).__mro__)


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    # nn.Module.apply's order (children first), which transformers' init uses
    for child in module.children():
        yield from _post_order(child)
    yield module


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _own_tensors(module: nn.Module) -> Iterator[tuple[dict[str, torch.Tensor | None], str]]:
    for table in (module._parameters, module._buffers):
        for name, value in table.items():
            if value is not None:
                yield table, name  # type: ignore[misc]


def _run_on_full(module: nn.Module, init: Callable[[nn.Module], object]) -> None:
    """Run `init(module)` with the module's own DTensors swapped for full-size plain
    tensors, then keep each rank's part."""
    swapped: list[tuple[dict[str, torch.Tensor | None], str, torch.Tensor, torch.Tensor]] = []
    for table, name in _own_tensors(module):
        value = table[name]
        assert value is not None
        if not isinstance(value, DTensor):
            continue
        full = torch.empty(value.shape, dtype=value.dtype, device=_local(value).device)
        full.copy_(full.new_full((), _poison_value(full.dtype)).expand_as(full))
        stand_in = (
            nn.Parameter(full, requires_grad=value.requires_grad)
            if (isinstance(value, nn.Parameter))
            else full
        )
        swapped.append((table, name, value, full))
        table[name] = stand_in
    try:
        init(module)
    finally:
        for table, name, value, full in swapped:
            table[name] = value
            fill_from_full(value, full)


def _poison_value(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return False
    return int(torch.iinfo(dtype).min)


def _unset(tensor: torch.Tensor) -> bool:
    local = _local(tensor)
    if local.numel() == 0 or local.dtype == torch.bool:
        return False
    if local.dtype.is_floating_point or local.dtype.is_complex:
        return bool(torch.isnan(local).any())
    return bool((local == torch.iinfo(local.dtype).min).any())


def _poison(model: nn.Module) -> None:
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            local = _local(tensor)
            local.fill_(_poison_value(local.dtype))


def _refuse_unset(model: nn.Module) -> None:
    params = [name for name, p in model.named_parameters() if _unset(p)]
    buffers = [name for name, b in model.named_buffers() if _unset(b)]
    if not params and not buffers:
        return
    parts = []
    if params:
        parts.append(f"parameters {', '.join(params[:5])}" + (" ..." if len(params) > 5 else ""))
    if buffers:
        parts.append(f"buffers {', '.join(buffers[:5])}" + (" ..." if len(buffers) > 5 else ""))
    buffer_hint = (
        "; a buffer computed in __init__ (e.g. a rotary table) holds nothing on meta:"
        " recompute it in init_weights()"
        if buffers
        else ""
    )
    raise ConfigError(
        f"{type(model).__name__} was built on the meta device and no initializer set its"
        f" {' and '.join(parts)}: {_PARAM_HINT}{buffer_hint}"
    )
