"""A training step's FLOPs, counted for MFU: the model's, never the recomputation's.

MFU divides the *model's* FLOPs by the peak: one forward times 3 (forward plus a
backward of twice its cost, PaLM's appendix B and torchtitan's convention), whatever
the step really spent. What activation checkpointing recomputes is extra hardware work,
not model work: counting it would reward recomputing. `StepFlopCounter` therefore keeps
two sums over the ops it sees:

- `forward_flops`: ops run outside autograd's backward (torch's public
  `ModuleTracker.is_bw`). Recomputation runs inside the backward, so it is not here;
  `model_flops` is three times this.
- `hardware_flops`: every op, forward, backward and recompute: what HFU divides.

Each op is counted with torch's own formula: `FlopCounterMode`'s table (built through
its public constructor) plus CPU's fused attention, which that table lacks (the CPU
SDPA kernel gets the formula torch uses for the CUDA kernels, through
`custom_mapping`). A DTensor counts its local shard, so under tensor parallel each rank
counts its own share, not the whole group's. The counter is a plain `TorchDispatchMode`
and overrides nothing of `FlopCounterMode`.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(8, 2, bias=False)
    >>> with StepFlopCounter() as counter:
    ...     layer(torch.ones(4, 8)).sum().backward()
    >>> counter.forward_flops, counter.model_flops, counter.hardware_flops
    (128, 384, 256)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.module_tracker import ModuleTracker

__all__ = ["BACKWARD_FACTOR", "StepFlopCounter", "cpu_attention_formulas", "flop_formulas"]

#: model FLOPs of a training step per forward FLOP: the forward and a backward of twice it
BACKWARD_FACTOR = 3


def _attention_forward(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(query, key, value))


def _attention_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any
) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return int(sdpa_backward_flop_count(grad_out, query, key, value))


def cpu_attention_formulas() -> dict[Any, Callable[..., int]]:
    """`custom_mapping` entries for CPU's fused SDPA kernels (query, key and value are
    `[batch, heads, seq, dim]` in both), with torch's SDPA formulas: without them a CPU
    run counts no attention at all.

    Example:
        >>> len(cpu_attention_formulas())
        2
    """
    aten = torch.ops.aten
    names: dict[str, Callable[..., int]] = {
        "_scaled_dot_product_flash_attention_for_cpu": _attention_forward,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward,
    }
    return {getattr(aten, name): f for name, f in names.items() if hasattr(aten, name)}


def flop_formulas() -> dict[Any, Callable[..., int]]:
    """Op -> FLOPs formula: torch's table as `FlopCounterMode` builds it, with CPU
    attention added. Each formula takes the op's arguments and `out_val`.

    Example:
        >>> torch.ops.aten.mm in flop_formulas()
        True
    """
    counter = FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas())
    return dict(counter.flop_registry)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


def _local(value: Any) -> Any:
    """A DTensor's local shard (its global shape would count the whole tensor-parallel
    group's work on every rank); anything else as it is."""
    if _DTENSOR is None or not isinstance(value, _DTENSOR):
        return value
    with torch.no_grad():
        return value.to_local()


_DTENSOR: Any = _dtensor_type()


class StepFlopCounter(TorchDispatchMode):
    """Counts the FLOPs of what runs inside it: `forward_flops`, `model_flops` (forward
    x 3, what MFU divides) and `hardware_flops` (all of it, recompute included: HFU's).
    See the module's docstring for the example.
    """

    def __init__(self) -> None:
        super().__init__()
        self.forward_flops = 0
        self.hardware_flops = 0
        self._formulas = flop_formulas()
        self._tracker = ModuleTracker()  # only asked `is_bw`, which needs no hooks

    @property
    def model_flops(self) -> int:
        return BACKWARD_FACTOR * self.forward_flops

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self._formulas.get(func.overloadpacket)
        if formula is not None:
            local_args, local_kwargs, local_out = tree_map(_local, (args, kwargs, out))
            flops = int(formula(*local_args, out_val=local_out, **local_kwargs))
            self.hardware_flops += flops
            if not self._tracker.is_bw:
                self.forward_flops += flops
        return out
