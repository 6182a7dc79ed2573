"""One layout's estimate: how sharding, tensor/pipeline/context parallelism and
checkpointing move bytes per GPU and on the wire."""

import pytest

from air_sdk.planner import (
    Cluster,
    ModelShape,
    TrainSetup,
    device_spec,
    estimate,
    layout_flags,
    layout_label,
    preset,
)
from air_sdk.planner.estimate import RESERVED_BYTES, USABLE_FRACTION
from air_sdk.schema import Parallelism

H100x8 = Cluster(device_spec("h100"), nodes=1, gpus_per_node=8)
H100x16 = Cluster(device_spec("h100"), nodes=2, gpus_per_node=8)
SETUP = TrainSetup(seq_len=4096)
GIB = 2**30


def layout(world, **sizes):
    return Parallelism(**sizes).resolve(world)


def test_ddp_holds_16_bytes_per_parameter_and_fsdp_divides_them():
    shape = preset("llama3-8b")
    ddp = estimate(shape, layout(8, dp_replicate=8, dp_shard=1), H100x8, SETUP)
    fsdp = estimate(shape, layout(8), H100x8, SETUP)
    n = shape.num_params
    assert ddp.memory.weights == n * 4 and ddp.memory.grads == n * 4
    assert ddp.memory.optimizer == n * 8  # AdamW: exp_avg and exp_avg_sq in fp32
    assert fsdp.memory.states == pytest.approx(ddp.memory.states / 8)
    hsdp = estimate(shape, layout(8, dp_replicate=2, dp_shard=4), H100x8, SETUP)
    assert hsdp.memory.states == pytest.approx(ddp.memory.states / 4)
    # DDP keeps gradient buckets and autocast's bf16 weight copies on top
    assert ddp.memory.buffers > n * 6


def test_tensor_and_pipeline_parallel_split_the_model():
    shape = preset("llama3-70b")
    tp8 = estimate(shape, layout(16, tp=8), H100x16, SETUP)
    tp4 = estimate(shape, layout(16, tp=4), H100x16, SETUP)
    # both shard what is left over 16 GPUs in all: the same states per GPU
    assert tp8.memory.states == pytest.approx(tp4.memory.states, rel=1e-3)
    # sequence parallel: activations go down with tp, but less than by half: the
    # gathered norm outputs and the whole logits are not split (test_tp_activations)
    assert tp4.memory.activations / 2 < tp8.memory.activations < tp4.memory.activations
    plain = {"activation_checkpointing": False}
    pp2 = estimate(shape, layout(16, tp=8, pp=2, dp_shard=1), H100x16, SETUP, **plain)
    no_pp = estimate(shape, layout(8, tp=8, dp_shard=1), H100x8, SETUP, **plain)
    assert pp2.memory.weights == pytest.approx(no_pp.memory.weights / 2, rel=0.02)
    # 1F1B: the first stage keeps pp micro-batches of its half of the layers; the output
    # (logits) lives on the last stage: the final norm's input and output split by tp,
    # the head's gathered input and the fp32 log-softmax whole
    h, tokens = shape.hidden_size, 4096
    output = 2 * h * 2 * tokens / 8 + (h * 2 + 4 * shape.vocab_size) * tokens
    assert pp2.memory.activations == pytest.approx(no_pp.memory.activations - output)


def test_activation_checkpointing_trades_memory_for_compute():
    shape = preset("llama3-8b")
    plain = estimate(shape, layout(8), H100x8, SETUP, activation_checkpointing=False)
    ac = estimate(shape, layout(8), H100x8, SETUP, activation_checkpointing=True)
    assert ac.memory.activations < plain.memory.activations / 5
    assert ac.activations_other == plain.memory.activations
    assert ac.compute_s == pytest.approx(plain.compute_s * 4 / 3)
    assert ac.mfu < plain.mfu  # recompute is not model FLOPs


def test_checkpointing_is_chosen_only_when_needed():
    shape = preset("llama3-8b")
    fits_plain = estimate(shape, layout(8), Cluster(device_spec("h200"), 1, 8), SETUP)
    assert fits_plain.fits and not fits_plain.activation_checkpointing
    long = TrainSetup(seq_len=32_768)
    needs_ac = estimate(shape, layout(8), H100x8, long)
    assert needs_ac.activation_checkpointing and needs_ac.fits


def test_fits_compares_the_total_with_the_usable_memory():
    shape = preset("llama3-70b")
    est = estimate(shape, layout(8), H100x8, SETUP)
    assert not est.fits
    assert est.memory.total > USABLE_FRACTION * device_spec("h100").memory_bytes
    m = est.memory
    assert m.total == pytest.approx(m.states + m.buffers + m.activations + RESERVED_BYTES)


def test_communication_bytes_follow_the_collectives():
    shape = preset("llama3-8b")
    n = shape.num_params
    ddp = estimate(shape, layout(8, dp_replicate=8, dp_shard=1), H100x8, SETUP)
    assert ddp.comm.dp == pytest.approx(2 * 7 / 8 * n * 4)  # ring all-reduce of fp32 grads
    fsdp = estimate(shape, layout(8), H100x8, SETUP)
    # forward and backward all-gather bf16 params, one reduce-scatter of fp32 grads
    assert fsdp.comm.fsdp == pytest.approx((2 * n * 2 + n * 4) * 7 / 8)
    tp = estimate(shape, layout(8, tp=8, dp_shard=1), H100x8, SETUP, activation_checkpointing=False)
    tokens, hidden = 4096, 4096
    assert tp.comm.tp == pytest.approx(8 * 7 / 8 * tokens * hidden * 2 * 32)
    # across nodes the same bytes take longer than over NVLink
    hsdp = estimate(shape, layout(16, dp_replicate=2, dp_shard=8), H100x16, SETUP)
    fsdp16 = estimate(shape, layout(16), H100x16, SETUP)
    assert fsdp16.comm.seconds["fsdp"] > hsdp.comm.seconds["fsdp"]


def test_context_parallel_splits_the_sequence():
    shape = preset("llama3-8b")
    long = TrainSetup(seq_len=65_536)
    cp1 = estimate(shape, layout(8, tp=8, dp_shard=1), H100x8, long, activation_checkpointing=True)
    cp2 = estimate(
        shape, layout(16, tp=8, cp=2, dp_shard=1), H100x16, long, activation_checkpointing=True
    )
    assert cp2.memory.activations == pytest.approx(cp1.memory.activations / 2)
    assert cp2.comm.cp > 0


def test_step_time_and_mfu():
    shape = preset("llama3-8b")
    est = estimate(shape, layout(8), Cluster(device_spec("h200"), 1, 8), SETUP)
    flops = shape.flops_per_token(4096) * 4096 * 8
    assert est.model_flops_per_step == flops
    # the assumed efficiency: torchtitan's published 33-39% MFU (Llama 3 8B, H100)
    assert SETUP.efficiency == 0.36
    assert est.compute_s == pytest.approx(flops / 8 / (989.4e12 * 0.36))
    assert est.step_s >= est.compute_s
    assert 0 < est.mfu <= 0.36
    assert est.tokens_per_s == pytest.approx(4096 * 8 / est.step_s)


def test_a_parameter_count_alone_gives_states_but_not_activations():
    shape = ModelShape.from_params(7_000_000_000)
    est = estimate(shape, layout(8), Cluster(device_spec("a100-80gb"), 1, 8), SETUP)
    assert est.memory.activations is None
    assert est.memory.states == pytest.approx(7e9 * 16 / 8)


def test_labels_and_flags_name_parallelism_fields():
    assert layout_label(layout(16, tp=8)) == "TP8 × FSDP2"
    assert layout_label(layout(32, pp=2, tp=8)) == "PP2 × TP8 × FSDP2"
    assert layout_label(layout(8, dp_replicate=8, dp_shard=1)) == "DDP8"
    assert layout_label(layout(1)) == "1 GPU"
    assert layout_flags(layout(32, pp=2, tp=8)) == "--dp-shard -1 --tp 8 --pp 2"
    assert layout_flags(layout(16, dp_replicate=2)) == "--dp-replicate 2 --dp-shard -1"
    flags = layout_flags(layout(16, tp=8, cp=2, dp_shard=1))
    assert flags == "--dp-shard -1 --tp 8 --cp 2"  # -1: what tp x cp leave, here 1
    names = {f.split()[0].removeprefix("--").replace("-", "_") for f in flags.split(" --")}
    assert names <= set(Parallelism.model_fields)


def test_the_efficiency_is_a_parameter_and_shown_with_the_times():
    import air_sdk

    slow = air_sdk.plan("llama3-8b", gpu="h100", nodes=1, gpus_per_node=8, efficiency=0.25)
    fast = air_sdk.plan("llama3-8b", gpu="h100", nodes=1, gpus_per_node=8, efficiency=0.5)
    assert slow.best.mfu < 0.25 < fast.best.mfu <= 0.5
    assert "assume the matmuls reach 25% of peak FLOP/s (--efficiency)" in str(slow)
