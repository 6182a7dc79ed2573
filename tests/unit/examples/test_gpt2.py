"""The GPT-2 example model: GPT-2's shape, weight tying, a forward and backward."""

from __future__ import annotations

import math

import torch

from air_sdk.examples.gpt2 import CONFIGS, GPT


def test_gpt2_small_has_gpt2s_shape_and_ties_its_output_to_the_embedding():
    with torch.device("meta"):
        model = GPT(CONFIGS["gpt2-124m"])
    assert model.lm_head.weight is model.wte.weight
    assert len(model.h) == 12 and model.wte.weight.shape == (50_304, 768)
    assert round(model.num_params() / 1e6, 1) == 124.5


def test_forward_gives_logits_and_a_loss_near_log_vocab_at_init():
    torch.manual_seed(0)
    model = GPT(CONFIGS["tiny"])
    idx, targets = torch.randint(0, 256, (2, 2, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, 256)
    assert abs(loss.item() - math.log(256)) < 0.5
    loss.backward()
    assert model.wte.weight.grad is not None
