"""Tensor-parallel plans: the built-in ones for Llama-style blocks, a user's own, and the
checks that no parameter is left out.

A plan maps module paths to `ParallelStyle`s (`torch.distributed.tensor.parallel`). Keys
may use `*` for one path segment (`"layers.*.attention.wq"`); `None` as a value keeps a
module's parameters whole on every tensor-parallel rank, on purpose.

The built-in plans are torchtitan's (Megatron-style TP with sequence parallelism):
between blocks the hidden state is sharded on the sequence dim (`Shard(1)`); the norms
run sequence-parallel; attention and MLP gather the sequence, shard their first
projections by column (q/k/v, gate/up) and their last by row (o, down), which
reduce-scatters back to sequence shards. The embedding is sharded by row (vocabulary)
and the head by column with its logits gathered whole (`Replicate`), so any loss
function works on them unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from air_sdk.errors import ConfigError
from air_sdk.runtime.parallel.blocks import Blocks
from air_sdk.runtime.parallel.hf import is_transformers_model, transformers_plan

__all__ = [
    "HF",
    "SCHEMES",
    "TITAN",
    "GatherSequence",
    "Plan",
    "Scheme",
    "builtin_plan",
    "check_coverage",
    "detect_scheme",
    "HEAD_COUNT_ATTRS",
    "HEAD_WIDTH_ATTRS",
    "divide_heads",
    "expand_plan",
]

Plan = Mapping[str, ParallelStyle | None]


class GatherSequence(ParallelStyle):
    """Before a module runs, gather its hidden-state input from sequence shards
    (`Shard(seq_dim)`, as sequence parallelism leaves it between blocks) to the whole
    sequence on every tensor-parallel rank. The input is the first positional tensor,
    or else the keyword `hidden_states` or `x`; other arguments pass unchanged, so it
    fits attention modules whatever else they take (rotary tables, masks).

    Like torchtitan's `PrepareModuleInput`, the module gets a replicated DTensor (not
    a local tensor, unless `use_local_output=True`): the column-wise projections
    inside then return partial input gradients that are summed before one
    reduce-scatter, instead of one all-reduce each.

    Example:
        >>> from torch.distributed.tensor.parallel import ColwiseParallel
        >>> plan = {"layers.*.attention": GatherSequence(), "layers.*.attention.wq": ColwiseParallel()}
    """

    def __init__(self, seq_dim: int = 1, use_local_output: bool = False) -> None:
        self.seq_dim = seq_dim
        self.use_local_output = use_local_output

    def _gather(self, tensor: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        if not isinstance(tensor, DTensor):
            tensor = DTensor.from_local(tensor, mesh, (Shard(self.seq_dim),), run_check=False)
        gathered = tensor.redistribute(mesh, (Replicate(),))
        return gathered.to_local() if self.use_local_output else gathered

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def hook(
            _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if args and isinstance(args[0], torch.Tensor):
                return (self._gather(args[0], device_mesh), *args[1:]), kwargs
            for key in ("hidden_states", "x"):
                if isinstance(kwargs.get(key), torch.Tensor):
                    return args, {**kwargs, key: self._gather(kwargs[key], device_mesh)}
            raise ConfigError(
                f"GatherSequence on {type(_module).__name__}: no tensor input (first"
                " positional argument, or hidden_states= / x=) to gather"
            )

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module

    def __repr__(self) -> str:
        return f"GatherSequence(seq_dim={self.seq_dim}, use_local_output={self.use_local_output})"


@dataclass(frozen=True)
class Scheme:
    """Module names of one Llama-style naming scheme (relative to a block, or to the
    module holding the blocks / the model for the outer modules)."""

    name: str
    attention: str
    qkv: tuple[str, str, str]
    out: str
    mlp: str
    mlp_in: tuple[str, ...]
    mlp_out: str
    norms: tuple[str, str]
    head_attrs: tuple[str, ...]
    embedding: str
    final_norm: str
    head: str

    def marker(self) -> str:
        return f"{self.attention}.{self.qkv[0]}"


TITAN = Scheme(
    name="titan",
    attention="attention",
    qkv=("wq", "wk", "wv"),
    out="wo",
    mlp="feed_forward",
    mlp_in=("w1", "w3"),
    mlp_out="w2",
    norms=("attention_norm", "ffn_norm"),
    head_attrs=("n_heads", "n_kv_heads", "n_local_heads", "n_local_kv_heads"),
    embedding="tok_embeddings",
    final_norm="norm",
    head="output",
)

HF = Scheme(
    name="hf",
    attention="self_attn",
    qkv=("q_proj", "k_proj", "v_proj"),
    out="o_proj",
    mlp="mlp",
    mlp_in=("gate_proj", "up_proj"),
    mlp_out="down_proj",
    norms=("input_layernorm", "post_attention_layernorm"),
    head_attrs=("num_heads", "num_key_value_heads"),
    embedding="embed_tokens",
    final_norm="norm",
    head="lm_head",
)

SCHEMES = (TITAN, HF)


def detect_scheme(model: nn.Module, blocks: Blocks) -> Scheme | None:
    """The naming scheme of the model's blocks, or None when neither built-in one fits.

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> from air_sdk.runtime.parallel.blocks import find_blocks
        >>> model = build_llama(LlamaConfig(naming="hf", n_layers=1))
        >>> detect_scheme(model, find_blocks(model)).name
        'hf'
    """
    block = next((b for _, b in blocks.items(model)), None)
    if block is None:
        return None
    names = {name for name, _ in block.named_modules()}
    for scheme in SCHEMES:
        if scheme.marker() in names or f"_checkpoint_wrapped_module.{scheme.marker()}" in names:
            return scheme
    return None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _outer_path(model: nn.Module, blocks: Blocks, name: str, kind: type[nn.Module]) -> str | None:
    """Where an outer module of the scheme is: next to the blocks, or on the model."""
    parent = blocks.path.rpartition(".")[0]
    for path in dict.fromkeys([_join(parent, name), name]):
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(module, kind) and not isinstance(module, nn.Identity):  # dropped by PP
            return path
    return None


def builtin_plan(
    model: nn.Module, blocks: Blocks, *, stage: bool = False, scheme: Scheme | None = None
) -> tuple[dict[str, ParallelStyle | None], Scheme]:
    """The built-in plan for the model's blocks (torchtitan or Hugging Face names), with
    concrete module paths.

    Raises ConfigError saying to pass `tp_plan=` when the blocks follow neither scheme,
    or when the embedding or the head is not where the scheme puts it (`stage=True`:
    a pipeline stage, which may lack them; it passes the whole model's `scheme`, as
    the stage may hold no block to tell it by).

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> from air_sdk.runtime.parallel.blocks import find_blocks
        >>> model = build_llama(LlamaConfig(n_layers=1))
        >>> plan, scheme = builtin_plan(model, find_blocks(model))
        >>> plan["layers.0.attention.wo"], scheme.name
        (RowwiseParallel(input_layouts=(Shard(dim=-1),), output_layouts=(Shard(dim=1),), use_local_output=True), 'titan')
    """
    if scheme is None:
        scheme = detect_scheme(model, blocks)
    if is_transformers_model(model):  # its own plan: positions come from the whole sequence
        return expand_plan(model, transformers_plan(model, stage=stage), stage=stage), scheme or HF
    if scheme is None:
        block = next((b for _, b in blocks.items(model)), nn.Module())
        children = ", ".join(name for name, _ in block.named_children())
        raise ConfigError(
            f"no built-in tensor-parallel plan fits {blocks.block_class.__name__} (children:"
            f" {children}); the built-in plans know torchtitan's attention.wq/wk/wv/wo and"
            " Hugging Face's self_attn.q_proj/k_proj/v_proj/o_proj: pass tp_plan={module"
            " path: ParallelStyle}"
        )
    plan: dict[str, ParallelStyle | None] = {}
    embedding = _outer_path(model, blocks, scheme.embedding, nn.Embedding)
    final_norm = _outer_path(model, blocks, scheme.final_norm, nn.Module)
    head = _outer_path(model, blocks, scheme.head, nn.Linear)
    for role, path, name in (
        ("token embedding", embedding, scheme.embedding),
        ("output head", head, scheme.head),
    ):
        if path is None and not stage:
            raise ConfigError(
                f"the built-in {scheme.name} tensor-parallel plan needs the {role}"
                f" {name!r} next to {blocks.path!r} or on the model, and"
                f" {type(model).__name__} has none: pass tp_plan={{module path: ParallelStyle}}"
            )
    if embedding is not None:
        plan[embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if final_norm is not None:
        plan[final_norm] = SequenceParallel()
    if head is not None:
        plan[head] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    for block_path in blocks.paths():
        p = block_path + "."
        plan[p + scheme.norms[0]] = SequenceParallel()
        plan[p + scheme.attention] = GatherSequence()
        for name in scheme.qkv:
            plan[f"{p}{scheme.attention}.{name}"] = ColwiseParallel()
        plan[f"{p}{scheme.attention}.{scheme.out}"] = RowwiseParallel(output_layouts=Shard(1))
        plan[p + scheme.norms[1]] = SequenceParallel()
        plan[p + scheme.mlp] = GatherSequence()
        for name in scheme.mlp_in:
            plan[f"{p}{scheme.mlp}.{name}"] = ColwiseParallel()
        plan[f"{p}{scheme.mlp}.{scheme.mlp_out}"] = RowwiseParallel(output_layouts=Shard(1))
    return plan, scheme


def _matches(pattern: str, path: str) -> bool:
    parts, segments = pattern.split("."), path.split(".")
    return len(parts) == len(segments) and all(
        fnmatchcase(seg, part) for part, seg in zip(parts, segments, strict=True)
    )


def expand_plan(
    model: nn.Module, plan: Plan, *, stage: bool = False
) -> dict[str, ParallelStyle | None]:
    """A user's plan with every key (`*` for one path segment) replaced by the concrete
    module paths it matches. Raises ConfigError for a key that matches nothing, except
    on a pipeline stage (`stage=True`), which holds only part of the model: there keys
    may match nothing, and the modules the stage dropped (`nn.Identity`) are skipped.

    Example:
        >>> import torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> sorted(expand_plan(model, {"*": None}))
        ['0', '1']
    """
    paths = [
        path
        for path, module in model.named_modules()
        if path and not (stage and isinstance(module, nn.Identity))
    ]
    expanded: dict[str, ParallelStyle | None] = {}
    for pattern, style in plan.items():
        if style is not None and not isinstance(style, ParallelStyle):
            raise ConfigError(
                f"tp_plan[{pattern!r}] is {type(style).__name__}: give a ParallelStyle"
                " (ColwiseParallel(), RowwiseParallel(), SequenceParallel(), ...) or None"
            )
        hits = [path for path in paths if _matches(pattern, path)]
        if not hits and not stage:
            sample = ", ".join(paths[:6])
            raise ConfigError(
                f"tp_plan key {pattern!r} matches no module of {type(model).__name__}"
                f" (its module paths look like: {sample}): fix the key; '*' matches one"
                " path segment"
            )
        for path in hits:
            expanded[path] = style
    return expanded


# Styles that shard their own module's parameters, and styles that touch none (they
# only move inputs or outputs). Everything else (SequenceParallel, None, a user's own
# style) is taken to cover every parameter under its module.
_OWN = (ColwiseParallel, RowwiseParallel)
_NONE = (GatherSequence, PrepareModuleInput, PrepareModuleOutput, PrepareModuleInputOutput)


def check_coverage(model: nn.Module, plan: Mapping[str, ParallelStyle | None], tp: int) -> None:
    """Refuse a plan that leaves a module's parameters plain tensors under tp > 1: each
    tensor-parallel rank would train its own copy on part of the work, and they would
    drift apart. Column/row-wise styles cover their module's own parameters; sequence
    parallel, `None` and a user's own styles cover everything under their module.

    Example:
        >>> import torch.nn as nn
        >>> check_coverage(nn.Sequential(nn.Linear(2, 2)), {}, tp=2)
        Traceback (most recent call last):
        ...
        air_sdk.errors.ConfigError: tp=2: no tensor-parallel rule covers 0 (Linear): its parameters would train apart on each tensor-parallel rank; pass tp_plan={module path: ParallelStyle} covering it (or None to keep it whole on purpose)
    """
    own = {p for p, style in plan.items() if isinstance(style, _OWN)}
    whole = tuple(
        p for p, style in plan.items() if style is None or not isinstance(style, _OWN + _NONE)
    )
    missed: dict[str, str] = {}
    for path, module in model.named_modules():
        if not any(True for _ in module.named_parameters(recurse=False)):
            continue
        if path in own or any(path == w or path.startswith(w + ".") for w in whole):
            continue
        key = re.sub(r"(?<=\.)\d+(?=\.)", "*", path)
        missed.setdefault(key, type(module).__name__)
    if missed:
        names = ", ".join(f"{path} ({kind})" for path, kind in list(missed.items())[:5])
        more = f" and {len(missed) - 5} more" if len(missed) > 5 else ""
        raise ConfigError(
            f"tp={tp}: no tensor-parallel rule covers {names}{more}: its parameters would"
            " train apart on each tensor-parallel rank; pass tp_plan={module path:"
            " ParallelStyle} covering it (or None to keep it whole on purpose)"
        )


#: Attribute names attention modules keep head counts in (torchtitan, Hugging Face,
#: GPT-2, Megatron and others): all of them are divided, whatever the naming scheme.
HEAD_COUNT_ATTRS = (
    "n_heads",
    "n_kv_heads",
    "n_head",
    "n_kv_head",
    "n_local_heads",
    "n_local_kv_heads",
    "num_heads",
    "num_kv_heads",
    "num_attention_heads",
    "num_key_value_heads",
)
#: Widths some attentions view their projections with (`(batch, seq, hidden_size)`):
#: divided where they equal the q projection's width (heads x head_dim).
HEAD_WIDTH_ATTRS = ("hidden_size", "embed_dim", "all_head_size", "inner_dim")
#: Integers with "head" in their name that are not counts of heads (kept as they are).
_NOT_COUNTS = frozenset({"head_dim", "head_size", "num_key_value_groups", "n_rep"})


def _head_attrs(attention: nn.Module) -> dict[str, int]:
    """The integer attributes of `attention` that count heads (known names, or any
    name with "head" in it that is not a per-head size or a ratio)."""
    found: dict[str, int] = {}
    for attr, value in vars(attention).items():
        if attr.startswith("_") or isinstance(value, bool) or not isinstance(value, int):
            continue
        if attr in HEAD_COUNT_ATTRS or ("head" in attr and attr not in _NOT_COUNTS):
            found[attr] = value
    return found


def divide_heads(model: nn.Module, blocks: Blocks, scheme: Scheme, tp: int) -> None:
    """Make each attention module count its local heads: divide every head-count
    attribute it keeps (`HEAD_COUNT_ATTRS`: torchtitan's `n_heads`/`n_kv_heads`, Hugging
    Face's `num_heads`/`num_key_value_heads`, GPT-2's `n_head`, ... whatever the
    projections' naming scheme), and a width in `HEAD_WIDTH_ATTRS` that equals the q
    projection's width, by `tp`. An attention may also keep none of them and view its
    projections as `(batch, seq, -1, head_dim)`.

    Raises ConfigError when a head count (or the q/k/v width over `head_dim`) is not a
    multiple of tp, and when the attention keeps an integer named like a head count
    that AIR does not know (its forward would view the local projections with the
    whole model's count): rename it to a known one, or view with -1.

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> from air_sdk.runtime.parallel.blocks import find_blocks
        >>> model = build_llama(LlamaConfig(n_heads=4, n_kv_heads=2, n_layers=1))
        >>> divide_heads(model, find_blocks(model), TITAN, 2)
        >>> model.layers[0].attention.n_heads, model.layers[0].attention.n_kv_heads
        (2, 1)
    """
    for block_path in blocks.paths():
        where = f"{block_path}.{scheme.attention}"
        attention = model.get_submodule(where)
        head_dim = getattr(attention, "head_dim", None)
        counts = _head_attrs(attention)
        unknown = sorted(a for a in counts if a not in HEAD_COUNT_ATTRS)
        if unknown:
            known = ", ".join(HEAD_COUNT_ATTRS)
            raise ConfigError(
                f"{where} ({type(attention).__name__}) keeps {unknown[0]}={counts[unknown[0]]},"
                f" a head count AIR does not know how to split over tp={tp}: keep head counts"
                f" in one of {known} (AIR divides those), or view the projections as"
                " (batch, seq, -1, head_dim); or pass tp_plan= with a plan of your own"
            )
        q_width = None
        if isinstance(head_dim, int) and head_dim > 0:
            for name in scheme.qkv:
                proj = getattr(attention, name, None)
                if isinstance(proj, nn.Linear):
                    counts.setdefault(f"{name} heads", proj.out_features // head_dim)
            q_proj = getattr(attention, scheme.qkv[0], None)
            if isinstance(q_proj, nn.Linear):
                q_width = q_proj.out_features
        for attr, count in counts.items():
            if count % tp:
                raise ConfigError(
                    f"{where}: {attr}={count} is not a multiple of"
                    f" tp={tp}: every tensor-parallel rank needs whole heads; use a tp that"
                    " divides the key/value heads, or more of them"
                )
        for attr in HEAD_COUNT_ATTRS:
            value = getattr(attention, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(attention, attr, value // tp)
        for attr in HEAD_WIDTH_ATTRS:
            value = getattr(attention, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value == q_width:
                setattr(attention, attr, value // tp)
