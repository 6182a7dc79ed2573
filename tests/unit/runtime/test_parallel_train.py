"""`air.parallelize` / `air.pipeline` training in a real 1-rank gloo world: the same losses
and gradients as the plain model, state dicts under the model's own names, and the
refusals. (Multi-rank layouts: tests/integration/test_parallel_jobs.py.)"""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError

torch = pytest.importorskip("torch")

from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402

import air_sdk.runtime as air  # noqa: E402
from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn, synthetic_batch  # noqa: E402

CONFIG = LlamaConfig(n_layers=2, n_kv_heads=2)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return synthetic_batch(CONFIG, batch_size=4, seq_len=16, step=0)


def plain_loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = build_llama(CONFIG)
    tokens, targets = batch()
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", [True, "selective"])
def test_activation_checkpointing_recomputes_to_the_same_gradients(gloo_world, mode):
    expected_loss, expected_grads = plain_loss_and_grads()
    model = air.parallelize(build_llama(CONFIG), activation_checkpointing=mode)
    assert type(model.layers[0]).__name__ == "CheckpointWrapper"
    tokens, targets = batch()
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    torch.testing.assert_close(loss.detach(), expected_loss, rtol=0, atol=0)
    grads = {
        n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()
    }
    torch.testing.assert_close(grads, expected_grads, rtol=1e-6, atol=1e-7)
    state, _ = get_state_dict(model, [])
    assert set(state) == set(build_llama(CONFIG).state_dict())  # no wrapper prefixes


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "Interleaved1F1B"])
def test_a_one_stage_pipeline_accumulates_microbatches_to_the_batch_gradient(gloo_world, schedule):
    expected_loss, expected_grads = plain_loss_and_grads()
    pipe = air.pipeline(build_llama(CONFIG), microbatches=2, loss_fn=loss_fn, schedule=schedule)
    assert pipe.is_first and pipe.is_last
    assert len(pipe.model_parts) == (2 if schedule == "Interleaved1F1B" else 1)
    loss = pipe.step(*batch())
    assert loss is not None
    # mean of two microbatch means of equal size = the batch mean; fp32 sums in another order
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    grads = {n: p.grad for part in pipe.model_parts for n, p in part.named_parameters()}
    torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-7)
    keys = [set(get_state_dict(part, [])[0]) for part in pipe.model_parts]
    assert set().union(*keys) == set(pipe.state_dict()) == set(build_llama(CONFIG).state_dict())
    if schedule == "Interleaved1F1B":
        with pytest.raises(ConfigError, match=r"eval_step needs a one-stage-per-rank schedule"):
            pipe.eval_step(*batch())
    else:  # the weights have not moved: no optimizer step yet
        assert float(pipe.eval_step(*batch())) == pytest.approx(float(expected_loss), abs=1e-5)


def test_pipeline_refusals_say_what_to_change(gloo_world):
    with pytest.raises(
        ConfigError, match=r"schedule='ZeroBubble': use one of 1F1B, GPipe, Interleaved1F1B"
    ):
        air.pipeline(build_llama(CONFIG), microbatches=2, loss_fn=loss_fn, schedule="ZeroBubble")
    with pytest.raises(ConfigError, match=r"microbatches=0: give at least 1"):
        air.pipeline(build_llama(CONFIG), microbatches=0, loss_fn=loss_fn)
    pipe = air.pipeline(build_llama(CONFIG), microbatches=3, loss_fn=loss_fn)
    with pytest.raises(
        ConfigError, match=r"inputs has 4 rows, which do not split into 3 microbatches"
    ):
        pipe.step(*batch())


def test_context_parallel_is_refused_on_cpu(gloo_world):
    tokens, targets = batch()
    with (
        pytest.raises(
            ConfigError, match=r"context parallelism \(cp=1\) runs only on GPUs.*keep cp=1"
        ),
        air.context_parallel(tokens, targets),
    ):
        pass


@pytest.mark.slow  # inductor compiles the block on CPU: about a minute on 2 busy cores
def test_compiled_blocks_train_like_the_plain_model(gloo_world):
    expected_loss, _ = plain_loss_and_grads()
    model = air.parallelize(build_llama(CONFIG), compile=True)
    tokens, targets = batch()
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    torch.testing.assert_close(loss.detach(), expected_loss, rtol=1e-5, atol=1e-5)
    state, _ = get_state_dict(model, [])
    assert set(state) == set(build_llama(CONFIG).state_dict())


def test_context_parallel_wants_one_seq_dim_per_buffer(gloo_world):
    tokens, targets = batch()
    with (
        pytest.raises(ConfigError, match=r"2 buffers but 1 seq_dims: give one per buffer"),
        air.context_parallel(tokens, targets, seq_dims=[1]),
    ):
        pass
