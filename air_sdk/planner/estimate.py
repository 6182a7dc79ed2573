"""One layout's estimate: bytes per GPU, bytes on the wire per step, and step time.

Memory per GPU (the stage that holds most):

| part        | what                                                                 |
|-------------|----------------------------------------------------------------------|
| weights     | fp32 parameters (the master copy), split by tp and pp, sharded by FSDP over dp_shard x cp |
| grads       | fp32 gradients, split the same way                                   |
| optimizer   | AdamW's exp_avg and exp_avg_sq, fp32, split the same way             |
| buffers     | bf16 compute copies (FSDP's unsharded layers in flight, autocast's weight cache), DDP's gradient buckets, the fp32 logits gradient |
| activations | what autograd keeps, per Korthikanti et al.: per layer and token, split by tp (sequence parallel; but each block's two gathered norm outputs and the whole logits' fp32 log-softmax are not) and cp, times the micro-batches a pipeline stage holds (1F1B: min(pp, micro-batches)); with activation checkpointing only each layer's input plus one layer being recomputed |
| reserved    | 2 GiB: CUDA context, NCCL's buffers, cuBLAS workspaces               |

A layout fits when the total is at most 95% of the GPU's memory (the caching
allocator's fragmentation takes the rest).

Communication per GPU and step, as ring collectives move it: FSDP all-gathers the
bf16 parameters for forward and backward and reduce-scatters fp32 gradients;
HSDP/DDP all-reduce gradients across replicas; tensor + sequence parallel moves
4 all-gather/reduce-scatter pairs of activations per layer (6 with recompute);
pipeline stages send activations forward and gradients back; context parallel
passes key/value chunks around its ring. Time = bytes / bus bandwidth (NVLink
inside a node, the network across) + a latency per collective. Data-parallel and
context-parallel traffic overlaps with compute; tensor- and pipeline-parallel
traffic is on the critical path.

Example:
    >>> from air_sdk.planner.devices import device_spec
    >>> from air_sdk.planner.model import preset
    >>> from air_sdk.schema import Parallelism
    >>> est = estimate(preset("llama3-8b"), Parallelism(tp=8).resolve(16),
    ...                Cluster(device_spec("h200"), nodes=2, gpus_per_node=8), TrainSetup(8192))
    >>> est.fits, est.label
    (True, 'TP8 × FSDP2')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from air_sdk.planner.devices import DeviceSpec
from air_sdk.planner.model import ModelShape
from air_sdk.schema.spec import Parallelism

__all__ = [
    "RESERVED_BYTES",
    "USABLE_FRACTION",
    "Cluster",
    "CommBreakdown",
    "LayoutEstimate",
    "MemoryBreakdown",
    "TrainSetup",
    "estimate",
    "layout_flags",
    "layout_label",
]

#: CUDA context, NCCL buffers, cuBLAS workspaces: held on every GPU before any tensor
RESERVED_BYTES = 2 * 2**30
#: the share of a GPU's memory a plan may fill (the allocator fragments the rest)
USABLE_FRACTION = 0.95
#: seconds each collective costs besides its bytes (NCCL launch and sync)
_LATENCY_INTRA_S = 10e-6
_LATENCY_INTER_S = 30e-6
_FP32 = 4
#: blocks assumed for a model known only by its parameter count
_ASSUMED_LAYERS = 32
_ADAM_STATES = 2


#: The assumed share of peak FLOP/s, calibrated to published figures: torchtitan reports
#: 33-39% MFU for Llama 3 8B on H100s (bf16, FSDP, torch.compile; torchtitan's
#: docs/performance.md and arXiv 2410.06511); 0.36 is the middle, and gives the planner
#: 36% MFU for Llama 3 8B, FSDP8, seq 8192 on 8 H100. `air plan --efficiency` changes it.
DEFAULT_EFFICIENCY = 0.36


@dataclass(frozen=True)
class TrainSetup:
    """What one training step runs (independent of the layout).

    Example:
        >>> TrainSetup(seq_len=4096, micro_batch=2).tokens_per_micro_batch
        8192
    """

    seq_len: int
    micro_batch: int = 1
    #: micro-batches per step on each data-parallel rank (pipelines use at least pp)
    grad_accum: int = 1
    precision: Literal["bf16-mixed", "fp32"] = "bf16-mixed"
    #: None: use it only where a layout does not fit without it
    activation_checkpointing: bool | None = None
    flash_attention: bool = True
    #: the share of peak FLOP/s the matmuls reach: an assumption, printed wherever the
    #: planner shows time or MFU (see `DEFAULT_EFFICIENCY`)
    efficiency: float = DEFAULT_EFFICIENCY

    def __post_init__(self) -> None:
        if min(self.seq_len, self.micro_batch, self.grad_accum) < 1:
            raise ValueError("seq_len, micro_batch and grad_accum must be at least 1")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], not {self.efficiency}")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.seq_len * self.micro_batch

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element: bf16 under mixed precision, else fp32."""
        return 2 if self.precision == "bf16-mixed" else _FP32


@dataclass(frozen=True)
class Cluster:
    """`nodes` nodes of `gpus_per_node` GPUs of one type.

    Example:
        >>> from air_sdk.planner.devices import device_spec
        >>> Cluster(device_spec("h100"), nodes=4, gpus_per_node=8).world_size
        32
    """

    device: DeviceSpec
    nodes: int = 1
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("nodes and gpus_per_node must be at least 1")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def bandwidth(self, span: int) -> tuple[float, float]:
        """(bytes/s, latency s) of a collective over groups whose members lie within
        `span` consecutive ranks: inside one node if that fits, else across nodes."""
        if span <= self.gpus_per_node:
            return self.device.intra_node_bw, _LATENCY_INTRA_S
        return self.device.inter_node_bw, _LATENCY_INTER_S


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU by what holds them (`activations` None: the shape is unknown)."""

    weights: float
    grads: float
    optimizer: float
    buffers: float
    activations: float | None
    reserved: float = RESERVED_BYTES

    @property
    def states(self) -> float:
        """Weights, gradients and optimizer state: what sharding divides."""
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.buffers + (self.activations or 0.0) + self.reserved


@dataclass(frozen=True)
class CommBreakdown:
    """Bytes each GPU sends per step, by parallelism, and the time they take."""

    fsdp: float = 0.0
    dp: float = 0.0
    tp: float = 0.0
    pp: float = 0.0
    cp: float = 0.0
    #: seconds each takes on its links (not all of it is exposed)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.fsdp + self.dp + self.tp + self.pp + self.cp


@dataclass(frozen=True)
class LayoutEstimate:
    """What one layout costs. `fits` compares `memory.total` with the GPU's memory."""

    layout: Parallelism
    activation_checkpointing: bool
    memory: MemoryBreakdown
    #: activations with the other choice of activation checkpointing (None: unknown)
    activations_other: float | None
    comm: CommBreakdown
    compute_s: float
    exposed_comm_s: float
    step_s: float
    tokens_per_step: int
    num_micro_batches: int
    capacity_bytes: float
    #: model FLOPs per step, all GPUs together (no recompute)
    model_flops_per_step: float
    peak_flops_total: float
    #: bytes per GPU while the model is built: eagerly the whole fp32 model is on every
    #: rank before sharding; on the meta device only this rank's shards plus one
    #: layer drawn whole by the initializer
    init_eager_bytes: float = 0.0
    init_meta_bytes: float = 0.0

    @property
    def fits(self) -> bool:
        return self.memory.total <= USABLE_FRACTION * self.capacity_bytes

    @property
    def needs_meta_init(self) -> bool:
        """True when an eager build (the whole model on each rank) would not fit: build
        the model on the meta device (`with torch.device("meta"):`)."""
        return self.init_eager_bytes > USABLE_FRACTION * self.capacity_bytes

    @property
    def init_bytes(self) -> float:
        """The build's peak on the path the planner recommends (meta when eager fails)."""
        return self.init_meta_bytes if self.needs_meta_init else self.init_eager_bytes

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization this estimate implies (0..1)."""
        return self.model_flops_per_step / self.step_s / self.peak_flops_total

    @property
    def label(self) -> str:
        return layout_label(self.layout)

    @property
    def flags(self) -> str:
        return layout_flags(self.layout)


def layout_label(layout: Parallelism) -> str:
    """A short name: `PP2 × TP8 × FSDP4`, `HSDP 2x8`, `DDP8`, `1 GPU`.

    Example:
        >>> layout_label(Parallelism(dp_replicate=2, dp_shard=8))
        'HSDP 2x8'
    """
    parts = [f"{name}{size}" for name, size in (("PP", layout.pp), ("TP", layout.tp)) if size > 1]
    if layout.cp > 1:
        parts.append(f"CP{layout.cp}")
    rep, shard = layout.dp_replicate, layout.dp_shard
    if rep > 1 and shard > 1:
        parts.append(f"HSDP {rep}x{shard}")
    elif shard > 1:
        parts.append(f"FSDP{shard}")
    elif rep > 1:
        parts.append(f"DDP{rep}")
    return " × ".join(parts) or "1 GPU"


def layout_flags(layout: Parallelism) -> str:
    """The submit flags for `layout`, named as `Parallelism`'s fields with dashes.

    Example:
        >>> layout_flags(Parallelism(dp_shard=2, tp=8))
        '--dp-shard -1 --tp 8'
        >>> layout_flags(Parallelism(dp_replicate=8, dp_shard=1))
        '--dp-replicate 8 --dp-shard 1'
    """
    flags = []
    if layout.dp_replicate > 1:
        flags.append(f"--dp-replicate {layout.dp_replicate}")
    # -1: whatever the other sizes leave; 1 is spelled out only for DDP (replicas, no shards)
    ddp = layout.dp_replicate > 1 and layout.dp_shard == 1
    flags.append("--dp-shard 1" if ddp else "--dp-shard -1")
    for name in ("tp", "pp", "cp"):
        size = getattr(layout, name)
        if size > 1:
            flags.append(f"--{name} {size}")
    return " ".join(flags)


@dataclass(frozen=True)
class _Stage:
    """The parameters one GPU holds before FSDP sharding (the largest stage)."""

    params: float
    num_layers: int
    layer_params: float
    #: the largest unit FSDP unshards at once besides a layer (embedding or head)
    edge_params: float
    holds_output: bool


def _stage(shape: ModelShape, tp: int, pp: int) -> _Stage:
    if not shape.known:
        per = shape.num_params / (tp * pp)
        # FSDP unshards a layer at a time; without a shape, assume a typical depth
        return _Stage(per, 1, per / _ASSUMED_LAYERS, 0.0, True)
    layer = shape.layer_params_sharded / tp + shape.layer_params_replicated
    layers = -(-shape.num_layers // pp)
    embed = shape.embedding_params / tp + shape.position_params
    head = shape.head_params / tp + shape.final_norm_params
    if shape.tied_embeddings and pp > 1:
        head += shape.embedding_params / tp  # the last stage keeps its own copy
    if pp == 1:
        return _Stage(layers * layer + embed + head, layers, layer, max(embed, head), True)
    first, last = layers * layer + embed, layers * layer + head
    return _Stage(max(first, last), layers, layer, max(embed, head), last >= first)


def _activations(
    shape: ModelShape, layout: Parallelism, setup: TrainSetup, ac: bool, m: int, stage: _Stage
) -> tuple[float | None, float]:
    """(activation bytes, fp32 logits-gradient bytes) on the busiest stage.

    Under tensor parallelism, sequence parallelism splits most of a block's activations
    by tp, but AIR's plan (torchtitan's) keeps some whole: each block's two gathered
    norm outputs (the inputs of q/k/v and of the MLP's first matmuls, beside the
    sequence-split norm outputs), the head's gathered input and the whole logits'
    fp32 log-softmax (measured: tests/unit/planner/test_tp_activations.py)."""
    if not shape.known:
        return None, 0.0
    ab = setup.act_bytes
    seq_tokens = setup.tokens_per_micro_batch / layout.cp
    tokens = seq_tokens / layout.tp  # sequence parallel splits
    full = shape.layer_activation_bytes(
        ab, flash_attention=setup.flash_attention, seq_len=setup.seq_len
    )
    gathered = 2 * shape.hidden_size * ab * seq_tokens if layout.tp > 1 else 0.0
    kept = shape.checkpointed_layer_bytes(ab) * tokens if ac else full * tokens + gathered
    recompute = full * tokens + gathered if ac else 0.0
    if layout.tp > 1:
        output = 2 * shape.hidden_size * ab * tokens
        output += (shape.hidden_size * ab + _FP32 * shape.vocab_size) * seq_tokens
    else:
        output = shape.output_activation_bytes(ab) * tokens
    logits_grad = _FP32 * shape.vocab_size * (seq_tokens if layout.tp > 1 else tokens)
    if layout.pp == 1:
        return stage.num_layers * kept + output + recompute, logits_grad
    in_flight = min(layout.pp, m)  # 1F1B: the first stage holds pp micro-batches
    first = stage.num_layers * kept * in_flight
    last = stage.num_layers * kept + output
    return max(first, last) + recompute, logits_grad


def estimate(
    shape: ModelShape,
    layout: Parallelism,
    cluster: Cluster,
    setup: TrainSetup,
    *,
    activation_checkpointing: bool | None = None,
) -> LayoutEstimate:
    """Estimate `layout` (resolved: `dp_shard` is a size, not -1) for `shape` on `cluster`.

    `activation_checkpointing=None` takes the setup's choice, and where that is None
    too, checkpoints only when the layout does not fit without.
    """
    if layout.dp_shard < 1:
        layout = layout.resolve(cluster.world_size)
    ac = activation_checkpointing
    if ac is None:
        ac = setup.activation_checkpointing
    if ac is None:
        plain = _estimate(shape, layout, cluster, setup, False)
        if plain.fits or not shape.known:
            return plain
        return _estimate(shape, layout, cluster, setup, True)
    return _estimate(shape, layout, cluster, setup, ac)


def _estimate(
    shape: ModelShape, layout: Parallelism, cluster: Cluster, setup: TrainSetup, ac: bool
) -> LayoutEstimate:
    tp, pp, cp = layout.tp, layout.pp, layout.cp
    rep, shard = layout.dp_replicate, layout.dp_shard
    n = shard * cp  # FSDP shards over dp_shard x cp: context-parallel ranks hold equal weights
    cb = setup.act_bytes  # compute copies are bf16 under mixed precision
    m = max(setup.grad_accum, pp) if pp > 1 else setup.grad_accum
    stage = _stage(shape, tp, pp)
    p = stage.params

    # -- memory --------------------------------------------------------------------
    acts, logits_grad = _activations(shape, layout, setup, ac, m, stage)
    other, _ = _activations(shape, layout, setup, not ac, m, stage)
    if n > 1:
        unit = max(2 * stage.layer_params, stage.layer_params + stage.edge_params)
        # With pp, parameters stay unsharded across micro-batches (torchtitan's choice);
        # else a layer in flight and the next prefetched, and their unsharded grads.
        buffers = p * cb + unit * cb if pp > 1 else 2 * unit * cb
    else:
        buffers = p * 2 if setup.precision == "bf16-mixed" else 0.0  # autocast's weight cache
        if rep > 1:
            buffers += p * _FP32  # DDP's gradient buckets
    if stage.holds_output:
        buffers += logits_grad
    memory = MemoryBreakdown(
        weights=p * _FP32 / n,
        grads=p * _FP32 / n,
        optimizer=p * _FP32 * _ADAM_STATES / n,
        buffers=buffers,
        activations=acts,
    )

    # -- communication ---------------------------------------------------------------
    seconds: dict[str, float] = {}
    units = stage.num_layers + 2

    def timed(kind: str, num_bytes: float, span: int, num_collectives: float) -> float:
        bw, latency = cluster.bandwidth(span)
        seconds[kind] = num_bytes / bw + num_collectives * latency if num_bytes else 0.0
        return num_bytes

    fsdp = dp = tpb = ppb = cpb = 0.0
    if n > 1:
        gathers, scatters = (1, 1) if pp > 1 else (2 * m, m)
        fsdp_bytes = (gathers * p * cb + scatters * p * _FP32) * (n - 1) / n
        fsdp = timed("fsdp", fsdp_bytes, tp * n, (gathers + scatters) * units)
    if rep > 1:
        syncs = m if (n > 1 and pp == 1) else 1  # HSDP all-reduces after every reduce-scatter
        dp_bytes = syncs * 2 * (rep - 1) / rep * p * _FP32 / n
        dp = timed("dp", dp_bytes, tp * cp * shard * rep, syncs * max(units // 4, 1))
    tokens_mb = setup.tokens_per_micro_batch / cp
    if tp > 1 and shape.known:
        per_layer = (12 if ac else 8) * (tp - 1) / tp * tokens_mb * shape.hidden_size * cb
        tpb = timed("tp", per_layer * stage.num_layers * m, tp, (6 if ac else 4) * units * m)
    if pp > 1 and shape.known:
        ppb = timed(
            "pp", 2 * m * tokens_mb * shape.hidden_size * cb / tp, cluster.world_size, 2 * m
        )
    if cp > 1 and shape.known:
        chunk = 2 * tokens_mb * shape.kv_size * cb / tp
        rounds = (4 if ac else 3) * (cp - 1) * stage.num_layers * m
        cpb = timed("cp", rounds * chunk, tp * cp, rounds)
    comm = CommBreakdown(fsdp=fsdp, dp=dp, tp=tpb, pp=ppb, cp=cpb, seconds=seconds)

    # -- time ------------------------------------------------------------------------
    world = cluster.world_size
    peak = cluster.device.peak("bf16" if setup.precision == "bf16-mixed" else "fp32")
    tokens_per_step = setup.tokens_per_micro_batch * m * rep * shard
    model_flops = shape.flops_per_token(setup.seq_len) * tokens_per_step
    recompute = 4 / 3 if ac else 1.0  # a second forward is a third of forward + backward
    compute = model_flops * recompute / world / (peak * setup.efficiency)
    bubble = compute * (pp - 1) / m if pp > 1 else 0.0
    overlapped = seconds.get("fsdp", 0.0) + seconds.get("dp", 0.0) + seconds.get("cp", 0.0)
    exposed = seconds.get("tp", 0.0) + seconds.get("pp", 0.0)
    # The first all-gather and the last reduce-scatter have nothing to hide behind.
    exposed += max(overlapped / units, overlapped - compute)
    return LayoutEstimate(
        layout=layout,
        activation_checkpointing=ac,
        memory=memory,
        activations_other=other,
        comm=comm,
        compute_s=compute + bubble,
        exposed_comm_s=exposed,
        step_s=compute + bubble + exposed,
        tokens_per_step=tokens_per_step,
        num_micro_batches=m,
        capacity_bytes=cluster.device.memory_bytes,
        model_flops_per_step=model_flops,
        peak_flops_total=peak * world,
        init_eager_bytes=shape.num_params * _FP32,
        init_meta_bytes=memory.weights + max(stage.layer_params, stage.edge_params) * _FP32,
    )
