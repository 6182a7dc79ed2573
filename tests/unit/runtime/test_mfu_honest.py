"""Honest MFU from counted FLOPs: the model's FLOPs (forward x 3), not the recompute of
activation checkpointing (that is HFU, reported apart); attention counted on CPU too;
and no dependence on `FlopCounterMode`'s private methods."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import (
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from air_sdk.examples.gpt2 import CONFIGS, GPT
from air_sdk.planner.worker_env import flops_per_token
from air_sdk.runtime._flops import StepFlopCounter
from air_sdk.runtime._throughput import ThroughputMeter
from air_sdk.schema import JobSpec, ModelSpec

PEAK = 1e12
BATCH, SEQ, WIDTH, HEADS = 2, 16, 32, 4


class Block(torch.nn.Module):
    """Attention (SDPA) and an MLP, as a transformer block."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.mlp = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            t.view(BATCH, SEQ, HEADS, -1).transpose(1, 2) for t in self.qkv(x).split(WIDTH, 2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.mlp(y.transpose(1, 2).reshape(BATCH, SEQ, WIDTH))


class Model(torch.nn.Module):
    def __init__(self, *, ac: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
        self.ac = ac

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.ac is None:
                x = block(x)
            else:  # activation checkpointing: the block's forward runs again in backward
                x = checkpoint(block, x, use_reentrant=self.ac == "reentrant")
        return x


def _measured(model: torch.nn.Module) -> dict[str, float]:
    """What `air.log(step, tokens=...)` adds over three steps of one second each: the
    first interval is counted, the next one gives the rates."""
    x = torch.randn(BATCH, SEQ, WIDTH, requires_grad=True)
    meter = ThroughputMeter(peak_flops=PEAK, count_flops=True)
    meter.observe(1, 0.0, tokens=BATCH * SEQ)
    model(x).square().mean().backward()
    counted = meter.observe(2, 1.0, tokens=BATCH * SEQ)
    model(x).square().mean().backward()
    rates = meter.observe(3, 2.0, tokens=BATCH * SEQ)
    assert counted is not None and rates is not None
    return {**counted, **rates}


@pytest.mark.parametrize("ac", ["non-reentrant", "reentrant"])
def test_mfu_with_activation_checkpointing_equals_mfu_without(ac):
    plain = _measured(Model())
    recomputed = _measured(Model(ac=ac))
    # the same model and step time: the same model FLOPs and MFU
    assert recomputed["flops_per_step"] == plain["flops_per_step"]
    assert recomputed["mfu"] == pytest.approx(plain["mfu"], rel=1e-12)
    # the recompute is the hardware's work: HFU sees it, at most one more forward (the
    # non-reentrant kind stops once the saved tensors are back: not the last product)
    forward = plain["flops_per_step"] / 3
    extra = recomputed["hardware_flops_per_step"] - plain["hardware_flops_per_step"]
    assert 0.5 * forward <= extra <= forward
    assert recomputed["hfu"] > plain["hfu"] > 0


def test_attention_is_counted_on_cpu_with_torchs_sdpa_formula():
    q, k, v = (torch.randn(BATCH, HEADS, SEQ, WIDTH // HEADS, requires_grad=True) for _ in "qkv")
    with StepFlopCounter() as counter:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    one_forward = sdpa_flop_count(q.shape, k.shape, v.shape)  # torch's, for the CUDA kernels
    assert one_forward > 0
    assert counter.forward_flops == one_forward
    assert counter.model_flops == 3 * one_forward
    assert counter.hardware_flops > 2 * one_forward  # the backward's five products too


def test_counted_gpt2_flops_agree_with_the_models_analytic_count():
    config = CONFIGS["tiny"]
    model = GPT(config)
    tokens = torch.randint(0, config.vocab_size, (2, config.block_size))
    with StepFlopCounter() as counter:
        _, loss = model(tokens, tokens)
        loss.backward()
    # what the runner sets as AIR_FLOPS_PER_TOKEN for a job that declares its model
    spec = JobSpec(
        code="pass",
        model=ModelSpec(
            arch="gpt2",
            num_layers=config.n_layer,
            hidden_size=config.n_embd,
            num_heads=config.n_head,
            vocab_size=config.vocab_size,
            seq_len=config.block_size,
        ),
    )
    per_token = flops_per_token(spec)
    assert per_token is not None
    analytic = per_token * tokens.numel()
    # 6 x matmul parameters + 12 x layers x width x seq per token; the analytic count
    # takes biases and norms for matmul parameters (1-2% here), the counter does not
    assert counter.model_flops == pytest.approx(analytic, rel=0.03)
    assert counter.model_flops < analytic


def test_counting_needs_no_private_method_of_flop_counter_mode(monkeypatch):
    def private(*args, **kwargs):
        raise AssertionError("FlopCounterMode._count_flops was called")

    baseline = _measured(Model())
    monkeypatch.setattr(FlopCounterMode, "_count_flops", private, raising=False)
    assert _measured(Model()) == baseline  # torch may move its internals: no matter


def test_a_users_own_flop_counter_around_the_step_still_counts_everything():
    model = Model()
    x = torch.randn(BATCH, SEQ, WIDTH)
    with FlopCounterMode(display=False) as theirs, StepFlopCounter() as ours:
        model(x).sum().backward()
    # both see every op; theirs lacks only the CPU attention kernel, forward and backward
    shape = (BATCH, HEADS, SEQ, WIDTH // HEADS)
    attention = sdpa_flop_count(shape, shape, shape)
    attention += sdpa_backward_flop_count(shape, shape, shape, shape)
    assert theirs.get_total_flops() > 0
    assert ours.hardware_flops == theirs.get_total_flops() + 2 * attention  # two blocks
