"""`parallelize()`: tensor parallelism, activation checkpointing, torch.compile and FSDP2
applied to a model in torchtitan's order, from the job's mesh.

1. TP + sequence parallelism (`parallelize_module`) over the mesh's `tp` dim, with the
   built-in plan for Llama-style blocks or the caller's `tp_plan`;
2. activation checkpointing per block (`checkpoint_wrapper`, full or selective);
3. `torch.compile` per block (the blocks repeat, so one compiled graph serves all);
4. FSDP2 `fully_shard` per block, then the root, over `dp_shard_cp`, or HSDP over
   (`dp_replicate`, `dp_shard_cp`) when dp_replicate > 1;
5. for a model built on the meta device: `to_empty` on this rank's device (only its
   shards take memory) and initialization (`materialize.py`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, parallelize_module

from air_sdk.errors import ConfigError
from air_sdk.runtime.parallel.blocks import Blocks, find_blocks, replace_block
from air_sdk.runtime.parallel.materialize import is_meta_model, materialize
from air_sdk.runtime.parallel.meshes import layout_of, mesh_device, submesh
from air_sdk.runtime.parallel.plans import (
    Plan,
    Scheme,
    builtin_plan,
    check_coverage,
    detect_scheme,
    divide_heads,
    expand_plan,
)
from air_sdk.runtime.parallel.replicas import check_replicas

__all__ = ["ActivationCheckpointing", "MixedPrecision", "builtin_tp_plan", "parallelize"]

MixedPrecision = Literal["auto", "bf16", "fp32"] | MixedPrecisionPolicy
ActivationCheckpointing = bool | Literal["none", "full", "selective"]


def parallelize(
    model: nn.Module,
    *,
    mesh: DeviceMesh | None = None,
    tp_plan: Plan | None = None,
    mixed_precision: MixedPrecision = "auto",
    activation_checkpointing: ActivationCheckpointing = False,
    compile: bool = False,
    reshard_after_forward: bool = True,
    blocks: str | None = None,
) -> nn.Module:
    """Parallelize `model` in place for the job's layout and return it.

    In torchtitan's order: tensor + sequence parallelism when tp > 1 (the built-in
    plan for Llama-style blocks in torchtitan or Hugging Face names, or `tp_plan`, a
    dict of module path, `*` for one segment, to `ParallelStyle`); activation
    checkpointing per block ("full"/True, or "selective": keep matmul and attention
    outputs, recompute the rest); `torch.compile` per block; FSDP2 `fully_shard` per
    block then the root (HSDP when dp_replicate > 1). The blocks are the model's
    outermost `nn.ModuleList`/`nn.ModuleDict`/`nn.Sequential` of one class, or the
    container `blocks` names (a module path such as "model.layers").

    A model bigger than one rank's memory: build it on the meta device
    (`with torch.device("meta"): model = Model(cfg)`); after sharding, only this rank's
    shards are allocated and set by the model's `init_weights()` (or each module's
    `reset_parameters()`; see `materialize.py`).

    `mixed_precision`: "auto" (bf16 parameters with fp32 gradient reduction on GPUs,
    fp32 on CPU), "bf16", "fp32", or a `MixedPrecisionPolicy`. Every rank must build
    the model with the same initial weights (seed it): FSDP2 shards what each rank
    holds without a broadcast. With pp > 1 use `air.pipeline`, which calls this on
    each stage. Refusals are `ConfigError`s that say what to change.

    Example:
        >>> import air_sdk.runtime as air
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> model = air.parallelize(build_llama(LlamaConfig()))  # doctest: +SKIP
        >>> optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)  # doctest: +SKIP
    """
    if mesh is None:
        from air_sdk.runtime.parallel.meshes import mesh as current_mesh

        mesh = current_mesh()
    layout = layout_of(mesh)
    if layout.pp > 1:
        raise ConfigError(
            f"pp={layout.pp}: a pipeline needs stages, not one model: use"
            " air.pipeline(model, microbatches=..., loss_fn=...), which splits the blocks"
            " and parallelizes each stage with the same options"
        )
    return apply_parallelisms(
        model,
        mesh,
        tp_plan=tp_plan,
        mixed_precision=mixed_precision,
        activation_checkpointing=activation_checkpointing,
        compile=compile,
        reshard_after_forward=reshard_after_forward,
        blocks=None if blocks is None else find_blocks(model, blocks),
    )


def apply_parallelisms(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    tp_plan: Plan | None,
    mixed_precision: MixedPrecision,
    activation_checkpointing: ActivationCheckpointing,
    compile: bool,
    reshard_after_forward: bool,
    stage: bool = False,
    blocks: Blocks | None = None,
    scheme: Scheme | None = None,
) -> nn.Module:
    """`parallelize` without the pp check. For a pipeline stage (`stage=True`, which may
    lack the embedding, the head, user plan keys of other stages, even every block),
    the pipeline passes the stage's `blocks` and the whole model's naming `scheme`."""
    _refuse_parallelized(model)
    layout = layout_of(mesh)
    device = mesh_device(mesh)
    policy = _policy(mixed_precision, device)
    ac_mode = _ac_mode(activation_checkpointing)
    on_meta = is_meta_model(model)
    if device.type == "cuda" and not on_meta:
        model.to(device)
    if blocks is None:
        blocks = find_blocks(model)
    if scheme is None and blocks.names:
        scheme = detect_scheme(model, blocks)
    if layout.tp > 1:
        _apply_tp(model, blocks, scheme, submesh("tp", mesh), tp_plan, layout.tp, stage)
    if ac_mode != "none":
        _apply_ac(model, blocks, ac_mode)
    if compile:
        _apply_compile(model, blocks)
    dp_size = layout.dp_replicate * layout.dp_shard * layout.cp
    if dp_size > 1 or policy.param_dtype is not None or policy.reduce_dtype is not None:
        dp_mesh = _fsdp_mesh(mesh)
        for _, block in blocks.items(model):
            fully_shard(
                block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward
            )
        fully_shard(
            model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward
        )
    if on_meta:
        materialize(model, device)
    check_replicas(model, mesh)  # HSDP / TP copies must agree: FSDP2 does not broadcast
    return model


def builtin_tp_plan(model: nn.Module) -> dict[str, ParallelStyle | None]:
    """The built-in tensor-parallel plan for `model` (concrete module paths), to extend
    and pass as `tp_plan=`: e.g. add `"layers.*.attention.gate": None` to keep an extra
    projection whole.

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> plan = builtin_tp_plan(build_llama(LlamaConfig(n_layers=1)))
        >>> plan["tok_embeddings"]
        RowwiseParallel(input_layouts=(Replicate(),), output_layouts=(Shard(dim=1),), use_local_output=True)
    """
    plan, _ = builtin_plan(model, find_blocks(model))
    return plan


def _apply_tp(
    model: nn.Module,
    blocks: Blocks,
    scheme: Scheme | None,
    tp_mesh: DeviceMesh,
    tp_plan: Plan | None,
    tp: int,
    stage: bool,
) -> None:
    if tp_plan is None:
        plan, scheme = builtin_plan(model, blocks, stage=stage, scheme=scheme)
    else:
        plan = expand_plan(model, tp_plan, stage=stage)
    check_coverage(model, plan, tp)
    if scheme is not None and blocks.names:
        q_path = f"{blocks.paths()[0]}.{scheme.attention}.{scheme.qkv[0]}"
        if isinstance(plan.get(q_path), ColwiseParallel):  # heads are split: count local ones
            divide_heads(model, blocks, scheme, tp)
    styles = {path: style for path, style in plan.items() if style is not None}
    if styles:
        parallelize_module(model, tp_mesh, styles)


# Ops whose outputs selective checkpointing keeps (the rest is recomputed in backward):
# torchtitan's list (torchtitan/distributed/activation_checkpoint.py): the matmuls
# (`nn.Linear` is `mm` without a bias, `addmm` with one), attention, the
# reduce-scatters of sequence parallelism and `max` (float8 scales); every second
# matmul is recomputed all the same, as torchtitan does, to halve what is kept.
_SAVE_OPS = (
    "mm",
    "addmm",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_flash_attention_for_cpu",
    "max",
)


def _save_list() -> set[Any]:
    aten = torch.ops.aten
    ops = {getattr(aten, n).default for n in _SAVE_OPS if hasattr(aten, n)}
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None and hasattr(functional, "reduce_scatter_tensor"):
        ops.add(functional.reduce_scatter_tensor.default)
    return ops


def _selective_context() -> Any:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _save_list()
    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if op in matmuls:
            counts[mode] += 1
            if counts[mode] % 2 == 0:  # every second matmul: recompute
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _apply_ac(model: nn.Module, blocks: Blocks, mode: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    container = blocks.container(model)
    for name, block in list(blocks.items(model)):
        if mode == "selective":
            wrapped = checkpoint_wrapper(
                block, context_fn=_selective_context, preserve_rng_state=False
            )
        else:
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        replace_block(container, name, wrapped)


def _apply_compile(model: nn.Module, blocks: Blocks) -> None:
    # Per block, after AC and before FSDP (as torchtitan): FSDP's hooks then run
    # outside the compiled graphs. The blocks become `_orig_mod` wrappers;
    # torch.distributed.checkpoint's get_state_dict drops that prefix again.
    container = blocks.container(model)
    for name, block in list(blocks.items(model)):
        replace_block(container, name, torch.compile(block))  # type: ignore[arg-type]


def _fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    # Without CP, the plain dims (a slice of the root mesh, as torchtitan's hand-written
    # code uses): FSDP's parameters then live on a (dp_shard, tp) mesh that is a plain
    # slice too. The flattened dp_shard_cp only when CP joins the shard dim.
    layout = layout_of(mesh)
    if layout.cp == 1:
        return mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
    if layout.dp_replicate == 1:
        return submesh("dp_shard_cp", mesh)
    with warnings.catch_warnings():  # HSDP with CP: the flattened name sliced with a plain one
        warnings.simplefilter("ignore", UserWarning)
        return mesh["dp_replicate", "dp_shard_cp"]


def _policy(mixed_precision: MixedPrecision, device: torch.device) -> MixedPrecisionPolicy:
    if isinstance(mixed_precision, MixedPrecisionPolicy):
        return mixed_precision
    if mixed_precision == "auto":
        mixed_precision = "bf16" if device.type == "cuda" else "fp32"
    if mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if mixed_precision == "fp32":
        return MixedPrecisionPolicy()
    raise ConfigError(
        f"mixed_precision={mixed_precision!r}: use 'auto', 'bf16', 'fp32' or a"
        " torch.distributed.fsdp.MixedPrecisionPolicy"
    )


def _ac_mode(value: ActivationCheckpointing) -> str:
    modes: Mapping[Any, str] = {
        False: "none",
        True: "full",
        "none": "none",
        "full": "full",
        "selective": "selective",
    }
    if isinstance(value, bool | str) and value in modes:
        return modes[value]
    raise ConfigError(
        f"activation_checkpointing={value!r}: use False, True (= 'full') or 'selective'"
    )


def _refuse_parallelized(model: nn.Module) -> None:
    if any(isinstance(m, FSDPModule) for m in model.modules()) or any(
        isinstance(p, DTensor) for p in model.parameters()
    ):
        raise ConfigError(
            f"{type(model).__name__} is parallelized already (it has FSDP modules or DTensor"
            " parameters): call air.parallelize once, on the plain model"
        )
