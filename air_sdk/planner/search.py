"""Every valid layout for a model on a cluster, estimated and ranked: `plan()`.

Candidates: data parallel only (DDP, FSDP, HSDP over every split of the
data-parallel ranks), tensor parallel inside a node (sizes dividing the GPUs per
node and the attention heads), pipeline stages (sizes dividing what is left, at
most the layer count) and, for sequences of 32k tokens and more, context
parallel. The fastest layout that fits comes first; the rest follow by speed,
then the ones that do not fit by memory.

Example:
    >>> p = plan("llama3-70b", gpu="h200", nodes=2, gpus_per_node=8)
    >>> p.best.flags
    '--dp-shard -1 --tp 8'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from air_sdk.planner.devices import DeviceSpec, device_spec
from air_sdk.planner.estimate import (
    DEFAULT_EFFICIENCY,
    USABLE_FRACTION,
    Cluster,
    LayoutEstimate,
    TrainSetup,
    estimate,
)
from air_sdk.planner.model import ModelShape, preset
from air_sdk.schema.spec import ModelSpec, Parallelism

__all__ = ["Plan", "candidate_layouts", "model_shape", "plan", "setup_for"]

#: sequences at least this long also try context parallelism
CP_MIN_SEQ_LEN = 32_768
_GIB = 2**30


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def model_shape(model: str | int | ModelShape | ModelSpec) -> ModelShape:
    """The shape the planner works on, from a preset name, a parameter count, a
    `ModelShape` or a `JobSpec.model` (`ModelSpec`, whose fields override its preset's).

    Raises ValueError for an unknown preset.

    Example:
        >>> model_shape(ModelSpec(preset="llama3-8b", num_layers=16)).num_layers
        16
    """
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, int):
        return ModelShape.from_params(model)
    if isinstance(model, str):
        return preset(model)
    fields = {
        "arch": model.arch,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "vocab_size": model.vocab_size,
        "ffn_hidden_size": model.ffn_hidden_size,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    if model.preset is not None:
        base = preset(model.preset)
        if not given:
            return base
        if "num_heads" in given and "num_kv_heads" not in given:
            given["num_kv_heads"] = given["num_heads"]
        return base.with_(name=f"{base.name} (changed)", **given)
    if model.num_layers is None:
        assert model.num_params is not None  # ModelSpec's validator
        return ModelShape.from_params(model.num_params)
    hidden = int(given["hidden_size"])
    heads = int(given["num_heads"])
    return ModelShape(
        name=f"{model.num_layers}x{hidden}",
        arch=model.arch or "llama",
        num_layers=int(given["num_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(given.get("num_kv_heads", heads)),
        vocab_size=int(given["vocab_size"]),
        ffn_hidden_size=int(given.get("ffn_hidden_size", 4 * hidden)),
    )


def setup_for(spec: ModelSpec, shape: ModelShape) -> TrainSetup:
    """The `TrainSetup` a `ModelSpec` describes (its sequence length defaults to the
    preset's).

    Example:
        >>> setup_for(ModelSpec(preset="gpt2-124m"), preset("gpt2-124m")).seq_len
        1024
    """
    return TrainSetup(
        seq_len=spec.seq_len or shape.default_seq_len,
        micro_batch=spec.micro_batch,
        grad_accum=spec.grad_accum,
        precision=spec.precision,
        activation_checkpointing=spec.activation_checkpointing,
    )


def candidate_layouts(shape: ModelShape, cluster: Cluster, seq_len: int) -> Iterator[Parallelism]:
    """Every layout worth estimating for `shape` on `cluster` (resolved sizes).

    Example:
        >>> from air_sdk.planner.devices import device_spec
        >>> from air_sdk.planner.estimate import layout_label
        >>> layouts = candidate_layouts(preset("gpt2-124m"), Cluster(device_spec("l4"), 1, 2), 1024)
        >>> sorted(layout_label(l) for l in layouts)
        ['DDP2', 'FSDP2', 'PP2', 'TP2']
    """
    world, per_node = cluster.world_size, cluster.gpus_per_node
    tps = [1]
    cps = [1]
    if shape.known:
        tps = [
            t
            for t in _divisors(per_node)
            if shape.num_heads % t == 0 and shape.num_kv_heads % t == 0
        ]
        if seq_len >= CP_MIN_SEQ_LEN:
            cps = [c for c in _divisors(world) if c <= 16 and seq_len % (2 * c) == 0]
    for tp in tps:
        for cp in cps:
            if world % (tp * cp):
                continue
            rest = world // (tp * cp)
            pps = [1]
            if shape.known:
                pps = [p for p in _divisors(rest) if p <= min(shape.num_layers, 32)]
            for pp in pps:
                dp = rest // pp
                for rep in _divisors(dp):
                    yield Parallelism(dp_replicate=rep, dp_shard=dp // rep, tp=tp, pp=pp, cp=cp)


@dataclass(frozen=True)
class Plan:
    """Every candidate layout's estimate, the best first.

    Example:
        >>> p = plan("gpt2-124m", gpu="l4", nodes=1, gpus_per_node=2)
        >>> p.best.fits
        True
    """

    shape: ModelShape
    cluster: Cluster
    setup: TrainSetup
    estimates: list[LayoutEstimate]

    @property
    def best(self) -> LayoutEstimate | None:
        """The fastest layout that fits (None: nothing fits these GPUs)."""
        first = self.estimates[0] if self.estimates else None
        return first if first is not None and first.fits else None

    @property
    def flags(self) -> str | None:
        """The submit flags of `best` (None when nothing fits)."""
        return self.best.flags if self.best is not None else None

    def rows(self, top: int | None = None) -> list[dict[str, Any]]:
        """One dict per layout (GiB, seconds, tokens/s), as tables print them."""
        rows = []
        for est in self.estimates[:top]:
            mem = est.memory
            used, other = mem.activations, est.activations_other
            no_ac, ac = (other, used) if est.activation_checkpointing else (used, other)
            comm = est.comm
            rows.append(
                {
                    "layout": est.label,
                    "flags": est.flags,
                    "ac": est.activation_checkpointing,
                    "weights_gib": mem.weights / _GIB,
                    "grads_gib": mem.grads / _GIB,
                    "optimizer_gib": mem.optimizer / _GIB,
                    "buffers_gib": mem.buffers / _GIB,
                    "activations_gib": _gib(used),
                    "activations_no_ac_gib": _gib(no_ac),
                    "activations_ac_gib": _gib(ac),
                    "total_gib": mem.total / _GIB,
                    "fits": est.fits,
                    "comm_gib": comm.total / _GIB,
                    "comm_by_kind_gib": {
                        kind: getattr(comm, kind) / _GIB
                        for kind in ("fsdp", "dp", "tp", "pp", "cp")
                        if getattr(comm, kind)
                    },
                    "compute_s": est.compute_s,
                    "exposed_comm_s": est.exposed_comm_s,
                    "step_s": est.step_s,
                    "tokens_per_step": est.tokens_per_step,
                    "tokens_per_s": est.tokens_per_s,
                    "mfu": est.mfu,
                }
            )
        return rows

    def header(self) -> str:
        """One line: the model, the batch and the cluster."""
        shape, setup, c = self.shape, self.setup, self.cluster
        usable = USABLE_FRACTION * c.device.memory_bytes / _GIB
        what = (
            f"{shape.name}: {shape.num_params / 1e9:.3g}B params"
            if shape.known
            else f"{shape.name} (no shape: activations not estimated)"
        )
        return (
            f"{what}, seq {setup.seq_len},"
            f" micro-batch {setup.micro_batch}, {setup.precision};"
            f" {c.nodes} x {c.gpus_per_node} {c.device.label} ({usable:.0f} GiB usable each);"
            f" times and MFU assume the matmuls reach {setup.efficiency:.0%} of peak FLOP/s"
            " (--efficiency)"
        )

    def __str__(self) -> str:
        return format_plan(self)


def _gib(value: float | None) -> float | None:
    return None if value is None else value / _GIB


def format_plan(p: Plan, top: int | None = 12) -> str:
    """The plan as a plain-text table (what `str(plan)` and the docs show)."""
    head = (
        "layout",
        "AC",
        "weights",
        "grads",
        "optim",
        "buffers",
        "activ",
        "(AC)",
        "total",
        "fits",
    )
    tail = ("comm/step", "step", "tokens/s", "MFU")
    lines = [p.header(), ""]
    table = [(*head, *tail)]
    for row in p.rows(top):
        no_ac, ac = row["activations_no_ac_gib"], row["activations_ac_gib"]
        table.append(
            (
                row["layout"],
                "yes" if row["ac"] else "no",
                f"{row['weights_gib']:.1f}",
                f"{row['grads_gib']:.1f}",
                f"{row['optimizer_gib']:.1f}",
                f"{row['buffers_gib']:.1f}",
                "?" if no_ac is None else f"{no_ac:.1f}",
                "?" if ac is None else f"{ac:.1f}",
                f"{row['total_gib']:.1f}",
                "yes" if row["fits"] else "NO",
                f"{row['comm_gib']:.1f} GiB",
                f"{row['step_s']:.2f} s",
                f"{row['tokens_per_s']:,.0f}",
                f"{row['mfu']:.0%}",
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    if top is not None and len(p.estimates) > top:
        lines.append(f"... and {len(p.estimates) - top} more layouts")
    lines.append("")
    lines.append(verdict(p))
    return "\n".join(lines)


def verdict(p: Plan) -> str:
    """The closing line: the flags of the best layout, or why nothing fits."""
    if p.best is not None:
        best = p.best
        ac = " with activation checkpointing" if best.activation_checkpointing else ""
        line = (
            f"fastest that fits: {best.label}{ac}, {best.memory.total / _GIB:.1f} GiB per GPU,"
            f" ~{best.tokens_per_s:,.0f} tokens/s\n  flags: {best.flags}"
        )
        if best.needs_meta_init:
            line += (
                '\n  build the model under `with torch.device("meta"):` (an eager build'
                f" holds the whole model, {best.init_eager_bytes / _GIB:.1f} GiB, on every"
                f" rank; on meta the build peaks at {best.init_meta_bytes / _GIB:.1f} GiB)"
            )
        return line
    least = min(p.estimates, key=lambda e: e.memory.total, default=None)
    if least is None:
        return "no layout to try"
    return (
        f"nothing fits: the leanest layout ({least.label}) needs"
        f" {least.memory.total / _GIB:.1f} GiB per GPU;"
        " add nodes, shorten the sequence, or lower the micro-batch"
    )


def plan(
    model: str | int | ModelShape | ModelSpec,
    gpu: str | DeviceSpec = "h100",
    nodes: int = 1,
    gpus_per_node: int = 8,
    *,
    seq_len: int | None = None,
    micro_batch: int = 1,
    grad_accum: int = 1,
    precision: Literal["bf16-mixed", "fp32"] = "bf16-mixed",
    activation_checkpointing: bool | None = None,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> Plan:
    """Estimate every layout of `model` on `nodes` x `gpus_per_node` GPUs of type `gpu`.

    `model` is a preset name (`llama3-8b`, `llama3-70b`, `gpt2-124m`, ...), a
    parameter count, a `ModelShape` or a `ModelSpec`; `gpu` a key of the device table
    (`h100`, `h200`, `a100-80gb`, `l4`, ...) or an NVML name.

    Example:
        >>> import air_sdk
        >>> p = air_sdk.plan("llama3-8b", gpu="h200", nodes=1, gpus_per_node=8, seq_len=8192)
        >>> p.best.label, p.flags
        ('FSDP8', '--dp-shard -1')
    """
    shape = model_shape(model)
    device = gpu if isinstance(gpu, DeviceSpec) else device_spec(gpu)
    cluster = Cluster(device, nodes, gpus_per_node)
    if isinstance(model, ModelSpec):
        setup = dataclasses.replace(setup_for(model, shape), efficiency=efficiency)
    else:
        setup = TrainSetup(
            seq_len=seq_len or shape.default_seq_len,
            micro_batch=micro_batch,
            grad_accum=grad_accum,
            precision=precision,
            activation_checkpointing=activation_checkpointing,
            efficiency=efficiency,
        )
    estimates = [
        estimate(shape, layout, cluster, setup)
        for layout in candidate_layouts(shape, cluster, setup.seq_len)
    ]
    # Fitting layouts by speed (within 0.5%, which an estimate cannot tell apart: the one
    # with more room to spare), then the rest by how close they come.
    estimates.sort(
        key=lambda e: (
            not e.fits,
            -float(f"{e.tokens_per_s:.3g}") if e.fits else 0.0,
            e.memory.total,
        )
    )
    return Plan(shape, cluster, setup, estimates)
