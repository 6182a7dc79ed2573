"""The tiny Llama of `air_sdk.examples.llama`: one model under two naming schemes."""

from __future__ import annotations

import doctest

import pytest

torch = pytest.importorskip("torch")

import air_sdk.examples.llama as llama  # noqa: E402
from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn, synthetic_batch  # noqa: E402


def test_both_namings_are_the_same_model_from_the_same_seed():
    config = LlamaConfig(n_kv_heads=2)
    titan, hf = build_llama(config), build_llama(LlamaConfig(naming="hf", n_kv_heads=2))
    tokens, targets = synthetic_batch(config, batch_size=2, seq_len=12, step=3)
    torch.testing.assert_close(titan(tokens), hf(tokens), rtol=0, atol=0)
    assert {n.replace("model.", "") for n in hf.state_dict()} >= {"lm_head.weight", "norm.weight"}
    assert "layers.0.attention.wq.weight" in titan.state_dict()
    assert "model.layers.0.self_attn.q_proj.weight" in hf.state_dict()


def test_weights_and_batches_are_deterministic():
    config = LlamaConfig(seed=7)
    first, second = build_llama(config), build_llama(config)
    torch.testing.assert_close(first.state_dict(), second.state_dict(), rtol=0, atol=0)
    other = build_llama(LlamaConfig(seed=8))
    assert not torch.equal(first.output.weight, other.output.weight)
    a = synthetic_batch(config, batch_size=3, seq_len=5, step=1)
    b = synthetic_batch(config, batch_size=3, seq_len=5, step=1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_loss_falls_when_it_trains():
    config = LlamaConfig(n_layers=2)
    model = build_llama(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    tokens, targets = synthetic_batch(config, batch_size=8, seq_len=16, step=0)
    losses = []
    for _ in range(5):
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"naming": "gpt"}, "naming='gpt': use 'hf' or 'titan'"),
        ({"dim": 60, "n_heads": 8}, "dim=60 is not a multiple of n_heads=8"),
        ({"n_heads": 4, "n_kv_heads": 3}, "n_heads=4 is not a multiple of n_kv_heads=3"),
        ({"dim": 12, "n_heads": 4}, "head_dim=3 must be even for rotary"),
    ],
)
def test_bad_configs_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**fields)


def test_batches_longer_than_the_rotary_table_are_refused():
    with pytest.raises(ValueError, match="seq_len=300 exceeds max_seq_len=256"):
        synthetic_batch(LlamaConfig(), batch_size=1, seq_len=300, step=0)


def test_the_docstring_examples_run():
    assert doctest.testmod(llama, raise_on_error=False).failed == 0


def test_the_training_example_runs_and_learns_on_one_rank(gloo_world):
    from air_sdk.examples import train_llama

    first = train_llama.main(["--steps", "1", "--seq-len", "16"])
    last = train_llama.main(["--steps", "30", "--seq-len", "16", "--naming", "hf"])
    assert last < first - 0.5
