"""Hugging Face `transformers` models under AIR's parallelisms: their own tensor-parallel
plan, and pipeline stages that return a tensor.

A `transformers` causal LM computes its position ids and causal mask from its input's
sequence length (`inputs_embeds.shape[1]`). The built-in sequence-parallel plan leaves
that input sharded on the sequence (the embedding's `Shard(1)` output), so each rank
would rotate and mask its half of the sequence as if it began at position 0: a
different model, silently. So a `transformers` model gets the plan its authors wrote,
`config.base_model_tp_plan` (q/k/v and gate/up column-wise, o and down row-wise, with
whole hidden states between them), translated to torch's `parallelize_module` styles:
the embedding and the norms stay whole on every tensor-parallel rank (their gradients
are equal there: every input gradient they see has been all-reduced), the head is
column-wise with its logits gathered whole, or whole when it is tied to the embedding.
A style the translation does not know is refused with the fix (`tp_plan=`).

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=64))
    >>> plan = transformers_plan(model)
    >>> plan["model.layers.*.self_attn.o_proj"], plan["model.embed_tokens"]
    (RowwiseParallel(input_layouts=(Shard(dim=-1),), output_layouts=(Replicate(),), use_local_output=True), None)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from air_sdk.errors import ConfigError

__all__ = ["StageLogits", "is_transformers_model", "stage_module", "transformers_plan"]

#: `transformers` plan styles and the torch style each one is (None: kept whole)
_STYLES: dict[str, Any] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
}


def is_transformers_model(model: nn.Module) -> bool:
    """True for a `transformers.PreTrainedModel` (or a pipeline stage copied from one).

    Example:
        >>> is_transformers_model(nn.Linear(2, 2))
        False
    """
    config = getattr(model, "config", None)
    # FSDP2 swaps the class for a subclass of its own: look through the bases
    ours = any(c.__module__.startswith("transformers.") for c in type(model).__mro__)
    return ours and hasattr(config, "base_model_tp_plan")


def _base_prefix(model: nn.Module) -> str:
    """The path of the base model inside a head model (`model` in LlamaForCausalLM)."""
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and isinstance(getattr(model, prefix, None), nn.Module):
        return prefix
    return ""


def _style(kind: str, key: str) -> ParallelStyle:
    make = _STYLES.get(kind)
    if make is None:
        raise ConfigError(
            f"the transformers tensor-parallel plan asks {key!r}: {kind!r}, which AIR does"
            f" not translate (it knows {', '.join(_STYLES)}): pass tp_plan={{module path:"
            " ParallelStyle}} for this model"
        )
    style: ParallelStyle = make()
    return style


def _tied_head(model: nn.Module, head: str) -> bool:
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    try:
        head_module = model.get_submodule(head)
    except AttributeError:
        return False
    weight = getattr(head_module, "weight", None)
    return isinstance(embeddings, nn.Module) and weight is getattr(embeddings, "weight", None)


def transformers_plan(model: nn.Module, *, stage: bool = False) -> dict[str, ParallelStyle | None]:
    """The model's own tensor-parallel plan (`config.base_model_tp_plan` under the base
    model's path, and the head's `_tp_plan`) as a `tp_plan` with `*` patterns; every
    other module with parameters (embedding, norms) maps to None (kept whole), and a
    head tied to the embedding too.

    Raises ConfigError when the model has no plan or uses a style AIR does not translate.
    """
    config = getattr(model, "config", None)
    base_plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    if not base_plan:
        raise ConfigError(
            f"{type(model).__name__} has no config.base_model_tp_plan: pass"
            " tp_plan={module path: ParallelStyle}"
        )
    prefix = _base_prefix(model)
    plan: dict[str, ParallelStyle | None] = {}
    for key, kind in base_plan.items():
        full = f"{prefix}.{key}" if prefix else key
        plan[full] = _style(str(kind), full)
    for key, kind in (getattr(model, "_tp_plan", None) or {}).items():
        if key in plan or (prefix and key.startswith(prefix + ".")):
            continue
        plan[key] = None if _tied_head(model, key) else _style(str(kind), key)
    covered = set(plan)
    from air_sdk.runtime.parallel.plans import _matches

    for path, module in model.named_modules():
        if not path or not any(True for _ in module.named_parameters(recurse=False)):
            continue
        if stage and isinstance(module, nn.Identity):
            continue
        if not any(_matches(pattern, path) for pattern in covered):
            plan[path] = None
    return plan


class StageLogits(nn.Module):
    """A pipeline stage of a `transformers` model as `torch.distributed.pipelining`
    needs it: a tensor in, a tensor out (the first stage takes token ids, the others
    hidden states through the dropped embedding's `nn.Identity`; the last returns the
    logits), with no cache. Holds the stage as `.stage`, which keeps the model's names.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=4, vocab_size=64))
        >>> StageLogits(model)(torch.zeros(1, 3, dtype=torch.long)).shape
        torch.Size([1, 3, 64])
    """

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = self.stage(inputs, use_cache=False)
        logits = out.logits if hasattr(out, "logits") else out[0]
        assert isinstance(logits, torch.Tensor)
        return logits


def stage_module(part: nn.Module) -> nn.Module:
    """What a pipeline stage runs: `StageLogits(part)` for a `transformers` model, else
    the part itself."""
    return StageLogits(part) if is_transformers_model(part) else part
