"""Model shapes: parameter counts against real modules, activation bytes against what
autograd actually keeps."""

import pytest
import torch
from tinyllama import TinyLlama, loss_of
from tinyllama import shape as tiny_shape

from air_sdk.examples.gpt2 import CONFIGS, GPT, GPTConfig
from air_sdk.planner import PRESETS, ModelShape, model_shape, preset
from air_sdk.schema import ModelSpec


def test_presets_have_their_published_sizes():
    assert preset("llama3-8b").num_params == pytest.approx(8.03e9, rel=1e-3)
    assert preset("llama3-70b").num_params == pytest.approx(70.55e9, rel=1e-3)
    assert preset("llama3-405b").num_params == pytest.approx(405.8e9, rel=2e-3)
    assert preset("gpt2-124m").num_params == pytest.approx(124.4e6, rel=1e-3)
    assert preset("llama3-8b").default_seq_len == 8192


def test_gpt2_preset_counts_what_the_example_model_holds():
    with torch.device("meta"):
        model = GPT(CONFIGS["gpt2-124m"])
    assert preset("gpt2-124m").num_params == model.num_params()


def test_llama_shape_counts_what_a_llama_module_holds():
    shape = tiny_shape(layers=3, hidden=96, heads=6, kv=2, vocab=200, ffn=256)
    model = TinyLlama(shape)
    assert shape.num_params == sum(p.numel() for p in model.parameters())


def test_unknown_preset_and_bad_shapes_say_what_to_change():
    with pytest.raises(ValueError, match="no model preset 'llama5'; known: llama3-8b"):
        preset("llama5")
    with pytest.raises(ValueError, match="not a multiple of num_heads"):
        ModelShape("x", "llama", 2, 100, 3, 3, 10, 10)
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        ModelShape("x", "llama", 2, 64, 4, 3, 10, 10)


def test_model_spec_fields_override_the_preset():
    shape = model_shape(ModelSpec(preset="llama3-8b", num_layers=16))
    assert shape.num_layers == 16 and shape.hidden_size == 4096
    custom = model_shape(
        ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=100, arch="gpt2")
    )
    assert (custom.arch, custom.num_kv_heads, custom.ffn_hidden_size) == ("gpt2", 4, 256)
    only = model_shape(ModelSpec(num_params=7_000_000_000))
    assert not only.known and only.num_params == 7_000_000_000
    assert only.flops_per_token(2048) == 6 * 7e9


def test_flops_per_token_is_six_per_matmul_parameter_plus_attention():
    shape = preset("llama3-8b")
    matmul = shape.num_params - shape.embedding_params  # the lookup does no matmul
    attention = 12 * 32 * 4096 * 8192
    assert shape.flops_per_token(8192) == 6 * matmul + attention
    gpt2 = preset("gpt2-124m")  # tied: the embedding is also the output layer's matmul
    assert (
        gpt2.flops_per_token(1024)
        == 6 * (gpt2.num_params - gpt2.position_params) + 12 * 12 * 768 * 1024
    )


def _saved_bytes(model: torch.nn.Module, run) -> int:
    """Bytes of the distinct storages autograd keeps for the backward (not weights)."""
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in owned:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def _planned(shape: ModelShape, tokens: int) -> float:
    per_token = shape.num_layers * shape.layer_activation_bytes(4) + shape.output_activation_bytes(
        4
    )
    return per_token * tokens


def test_llama_activation_bytes_match_what_autograd_keeps():
    torch.manual_seed(0)
    shape = tiny_shape(layers=4, hidden=128, heads=8, kv=2, vocab=512, ffn=320)
    model = TinyLlama(shape, seq=64)
    tokens = torch.randint(0, 512, (2, 64))
    measured = _saved_bytes(model, lambda: loss_of(model, tokens))
    assert measured == pytest.approx(_planned(shape, tokens.numel()), rel=0.10)


def test_gpt2_activation_bytes_match_what_autograd_keeps():
    torch.manual_seed(0)
    config = GPTConfig(block_size=64, vocab_size=512, n_layer=4, n_head=4, n_embd=128)
    model = GPT(config)
    shape = ModelShape("g", "gpt2", 4, 128, 4, 4, 512, 512, max_positions=64, tied_embeddings=True)
    tokens = torch.randint(0, 512, (2, 64))
    measured = _saved_bytes(model, lambda: model(tokens, tokens))
    assert measured == pytest.approx(_planned(shape, tokens.numel()), rel=0.10)


def test_checkpointing_keeps_only_each_layers_input():
    shape = PRESETS["llama3-8b"]
    assert shape.checkpointed_layer_bytes(2) == 2 * 4096
    assert shape.checkpointed_layer_bytes(2) < shape.layer_activation_bytes(2) / 20
    eager = shape.layer_activation_bytes(2, flash_attention=False, seq_len=8192)
    assert eager - shape.layer_activation_bytes(2) > 32 * 8192  # the s x s scores per head
