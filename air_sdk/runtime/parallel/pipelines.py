"""`pipeline()`: pipeline parallelism on `torch.distributed.pipelining`, composed with
FSDP and TP on each stage (torchtitan's manual split).

The model's blocks are cut into `pp` stages (`Interleaved1F1B`: `2 x pp` virtual stages,
two per rank, looped); each rank deep-copies the model for its stages, drops the rest
(see `blocks.build_stage`), parallelizes each stage with `parallelize`'s options over
the pp-free dims of the mesh, and drives them with a schedule. `Pipeline.step(inputs,
targets)` runs one whole batch as `microbatches` microbatches, gradients averaged over
them (torch's `scale_grads`), and returns the mean microbatch loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from air_sdk.errors import ConfigError
from air_sdk.runtime.parallel.apply import (
    ActivationCheckpointing,
    MixedPrecision,
    apply_parallelisms,
)
from air_sdk.runtime.parallel.blocks import Blocks, build_stage, find_blocks, split_stages
from air_sdk.runtime.parallel.hf import stage_module
from air_sdk.runtime.parallel.meshes import layout_object, layout_of, mesh_device, submesh
from air_sdk.runtime.parallel.plans import Plan, builtin_plan, detect_scheme, expand_plan

__all__ = ["SCHEDULES", "Pipeline", "pipeline"]

#: Schedule name -> (torch class, stages per rank).
SCHEDULES: dict[str, tuple[type[Any], int]] = {
    "1F1B": (Schedule1F1B, 1),
    "GPipe": (ScheduleGPipe, 1),
    "Interleaved1F1B": (ScheduleInterleaved1F1B, 2),
}

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Pipeline:
    """This rank's pipeline stages and their schedule; made by `pipeline()`.

    `model_parts` are the stage modules this rank holds (one, or two for
    Interleaved1F1B): give their parameters to the optimizer
    (`pipe.parameters()`), and the list to
    `torch.distributed.checkpoint.state_dict.get_state_dict(pipe.model_parts, opt)`.

    Example:
        >>> pipe = air.pipeline(model, microbatches=4, loss_fn=loss_fn)  # doctest: +SKIP
        >>> optimizer = torch.optim.AdamW(pipe.parameters(), lr=3e-4)  # doctest: +SKIP
        >>> loss = pipe.step(tokens, targets)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        schedule: Any,
        stages: list[PipelineStage],
        model_parts: list[nn.Module],
        mesh: DeviceMesh,
        microbatches: int,
        broadcast_loss: bool,
    ) -> None:
        self.schedule = schedule
        self.stages = stages
        self.model_parts = model_parts
        self.mesh = mesh
        self.microbatches = microbatches
        self.broadcast_loss = broadcast_loss
        self._device = mesh_device(mesh)
        self._pp = submesh("pp", mesh)

    @property
    def is_first(self) -> bool:
        """True on the ranks that hold the first stage (they read the inputs)."""
        return any(stage.is_first for stage in self.stages)

    @property
    def is_last(self) -> bool:
        """True on the ranks that hold the last stage (they compute the loss)."""
        return any(stage.is_last for stage in self.stages)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The parameters of this rank's stages (for the optimizer)."""
        for part in self.model_parts:
            yield from part.parameters()

    def state_dict(self) -> dict[str, Any]:
        """The stages' model state under the whole model's names (one dict over all of
        this rank's stages, through `get_model_state_dict`: no wrapper prefixes).

        Example:
            >>> sorted(pipe.state_dict())[:1]  # doctest: +SKIP
            ['layers.2.attention.wk.weight']
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {k: v for part in self.model_parts for k, v in get_model_state_dict(part).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what `state_dict()` gave (each stage takes its own keys)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        for part in self.model_parts:
            set_model_state_dict(part, state, options=StateDictOptions(strict=False))

    def train(self, mode: bool = True) -> Pipeline:
        for part in self.model_parts:
            part.train(mode)
        return self

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of one batch through the pipeline; gradients land in the
        stages' parameters (averaged over the microbatches), ready for `optimizer.step()`.

        Every rank passes the same call (the first stage reads `inputs`, the last
        `targets`; the others ignore them). Returns the mean of the microbatch losses:
        on every rank with `broadcast_loss=True` (the default: the last stage sends it
        over the pp group, one scalar), else on the last stage and None elsewhere.
        Detached: log it, do not backpropagate it.

        Example:
            >>> loss = pipe.step(tokens, targets)  # doctest: +SKIP
            >>> optimizer.step(); optimizer.zero_grad()  # doctest: +SKIP
        """
        return self._run(self.schedule.step, inputs, targets)

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The loss of one batch without gradients (same return rules as `step`), with the
        single-stage schedules (1F1B, GPipe).

        Example:
            >>> val_loss = pipe.eval_step(tokens, targets)  # doctest: +SKIP
        """
        if len(self.stages) > 1:
            # torch 2.13's runtime for multi-stage schedules runs the backward actions
            # even from `eval()` and fails; a forward-only pass needs a one-stage schedule.
            raise ConfigError(
                "eval_step needs a one-stage-per-rank schedule (1F1B or GPipe); with"
                " Interleaved1F1B torch's schedule cannot run forward only: use"
                " schedule='1F1B' or 'GPipe' where you need eval_step"
            )
        with torch.no_grad():
            return self._run(self.schedule.eval, inputs, targets)

    def _run(
        self, run: Callable[..., Any], inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor | None:
        for name, tensor in (("inputs", inputs), ("targets", targets)):
            if tensor.shape[0] % self.microbatches:
                raise ConfigError(
                    f"{name} has {tensor.shape[0]} rows, which do not split into"
                    f" {self.microbatches} microbatches: make this rank's batch a multiple"
                    " of microbatches"
                )
        losses: list[torch.Tensor] = []
        args = (inputs.to(self._device),) if self.is_first else ()
        target = targets.to(self._device) if self.is_last else None
        run(*args, target=target, losses=losses if self.is_last else None, return_outputs=False)
        loss = torch.stack([x.detach().float() for x in losses]).mean() if losses else None
        if not self.broadcast_loss or self._pp.size() == 1:
            return loss
        if loss is None:
            loss = torch.empty((), dtype=torch.float32, device=self._device)
        group = self._pp.get_group()
        src = dist.get_global_rank(group, self._pp.size() - 1)  # holds the last stage
        dist.broadcast(loss, src=src, group=group)
        return loss


def pipeline(
    model: nn.Module,
    *,
    microbatches: int,
    loss_fn: LossFn,
    schedule: str = "1F1B",
    mesh: DeviceMesh | None = None,
    broadcast_loss: bool = True,
    tp_plan: Plan | None = None,
    mixed_precision: MixedPrecision = "auto",
    activation_checkpointing: ActivationCheckpointing = False,
    compile: bool = False,
    reshard_after_forward: bool = False,
    blocks: str | None = None,
) -> Pipeline:
    """Split `model` into the job's `pp` stages and return this rank's `Pipeline`.

    The blocks (the outermost `nn.ModuleList`/`nn.ModuleDict`/`nn.Sequential` of one
    class, or the container `blocks` names, e.g. "model.layers") are cut into balanced
    runs; the modules with parameters registered before them (embeddings)
    go to the first stage, those after (final norm, head) to the last; elsewhere they
    are `nn.Identity`, so the model's forward must be a chain (inputs -> modules
    before -> blocks in order -> modules after), as Llama-style models are. Each stage
    is parallelized with `parallelize`'s options (TP, AC, compile, FSDP/HSDP over the
    pp-free dims; parameters stay gathered between microbatches unless
    `reshard_after_forward=True`).

    `schedule`: "1F1B" (default), "GPipe", or "Interleaved1F1B" (two stages per rank).
    `loss_fn(outputs, targets)` runs per microbatch on the last stage; make it a mean,
    so the gradients equal the whole batch's. Works with pp=1 too (gradient
    accumulation over microbatches).

    Example:
        >>> import air_sdk.runtime as air
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn
        >>> pipe = air.pipeline(build_llama(LlamaConfig()), microbatches=4, loss_fn=loss_fn)  # doctest: +SKIP
        >>> loss = pipe.step(tokens, targets)  # doctest: +SKIP
    """
    if mesh is None:
        from air_sdk.runtime.parallel.meshes import mesh as current_mesh

        mesh = current_mesh()
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule={schedule!r}: use one of {', '.join(SCHEDULES)}")
    if microbatches < 1:
        raise ConfigError(f"microbatches={microbatches}: give at least 1")
    schedule_class, per_rank = SCHEDULES[schedule]
    layout = layout_of(mesh)
    pp_mesh = submesh("pp", mesh)
    num_stages = layout.pp * per_rank
    split = split_stages(model, num_stages, blocks)
    found = find_blocks(model, blocks)
    scheme = detect_scheme(model, found)
    if layout.tp > 1:  # check the whole model's plan once; each stage holds only part of it
        if tp_plan is None:
            builtin_plan(model, found)
        else:
            expand_plan(model, tp_plan)
    pp_rank = layout_object(mesh).pp_rank  # this rank's stage: from the one Layout
    device = mesh_device(mesh)
    stages: list[PipelineStage] = []
    parts: list[nn.Module] = []
    for stage_index in (pp_rank + k * layout.pp for k in range(per_rank)):
        part = build_stage(model, split, stage_index)
        apply_parallelisms(
            part,
            mesh,
            tp_plan=tp_plan,
            mixed_precision=mixed_precision,
            activation_checkpointing=activation_checkpointing,
            compile=compile,
            reshard_after_forward=reshard_after_forward,
            stage=True,
            blocks=Blocks(found.path, split.blocks[stage_index], found.block_class),
            scheme=scheme,
        )
        parts.append(part)
        stages.append(
            PipelineStage(
                stage_module(part), stage_index, num_stages, device, group=pp_mesh.get_group()
            )
        )
    try:
        runner = schedule_class(
            stages if per_rank > 1 else stages[0], n_microbatches=microbatches, loss_fn=loss_fn
        )
    except ValueError as exc:
        raise ConfigError(
            f"{schedule} with {num_stages} stages and microbatches={microbatches}: {exc};"
            " change microbatches"
        ) from exc
    return Pipeline(
        schedule=runner,
        stages=stages,
        model_parts=parts,
        mesh=mesh,
        microbatches=microbatches,
        broadcast_loss=broadcast_loss,
    )
