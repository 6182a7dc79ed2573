"""Tensor parallelism splits heads: every head count an attention keeps is divided,
whatever its projections' naming scheme, an unknown one is refused with the fix, and a
`transformers` model gets its own plan (on a fake world of ranks in this process)."""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError
from air_sdk.schema import Parallelism

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
nn = torch.nn

from torch.distributed.tensor import Replicate  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # noqa: E402

import air_sdk.runtime as air  # noqa: E402
from air_sdk.examples.llama import HFAttention, LlamaConfig, build_llama  # noqa: E402
from air_sdk.runtime.parallel.apply import builtin_tp_plan  # noqa: E402


class NHeadsAttention(HFAttention):
    """Hugging Face projection names, torchtitan's head-count names (D2)."""

    def forward(self, hidden_states: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, self.n_heads, self.head_dim)
        return self.o_proj(q.reshape(b, s, self.n_heads * self.head_dim))


def with_attention(model: nn.Module, kind: type[nn.Module], **attrs: int) -> nn.Module:
    for layer in model.model.layers:
        attention = layer.self_attn
        attention.__class__ = kind
        del attention.num_heads, attention.num_key_value_heads
        for name, value in attrs.items():
            setattr(attention, name, value)
    return model


def test_tp_divides_n_heads_of_an_attention_with_hugging_face_names(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    model = with_attention(
        build_llama(LlamaConfig(naming="hf", n_heads=4, n_kv_heads=2)),
        NHeadsAttention,
        n_heads=4,
        n_kv_heads=2,
    )
    air.parallelize(model)
    attention = model.model.layers[0].self_attn
    assert (attention.n_heads, attention.n_kv_heads) == (2, 1)  # was left at (4, 2)


def test_a_width_the_attention_views_with_is_divided_with_the_heads(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    model = with_attention(
        build_llama(LlamaConfig(naming="hf", n_heads=4, n_kv_heads=2)),
        NHeadsAttention,
        n_heads=4,
        hidden_size=64,  # 4 heads of 16: the q width
        embed_dim=48,  # not the q width: some other size, kept
    )
    air.parallelize(model)
    attention = model.model.layers[0].self_attn
    assert (attention.n_heads, attention.hidden_size, attention.embed_dim) == (2, 32, 48)


def test_an_attention_keeping_an_unknown_head_count_is_refused_with_the_fix(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    model = with_attention(
        build_llama(LlamaConfig(naming="hf", n_heads=4, n_kv_heads=2)), NHeadsAttention, q_heads=4
    )
    with pytest.raises(
        ConfigError,
        match=r"model.layers.0.self_attn \(NHeadsAttention\) keeps q_heads=4, a head count AIR"
        r" does not know how to split over tp=2: keep head counts in one of n_heads, .*"
        r"num_key_value_heads .*or view the projections as \(batch, seq, -1, head_dim\)",
    ):
        air.parallelize(model)


def tiny(kind: str, **extra: object) -> nn.Module:
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    config = config_class(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        **extra,
    )
    return model_class(config)


def test_a_transformers_model_gets_its_own_plan_with_whole_hidden_states(fake_world):
    """transformers computes positions and the causal mask from the input's length:
    no sequence-parallel shards may reach it (the built-in plan's would)."""
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    plan = builtin_tp_plan(tiny("llama", tie_word_embeddings=False))
    assert plan["model.embed_tokens"] is None and plan["model.norm"] is None
    assert plan["model.layers.1.input_layernorm"] is None
    assert isinstance(plan["model.layers.0.self_attn.q_proj"], ColwiseParallel)
    o_proj = plan["model.layers.0.self_attn.o_proj"]
    assert isinstance(o_proj, RowwiseParallel) and o_proj.output_layouts == (Replicate(),)
    head = plan["lm_head"]
    assert isinstance(head, ColwiseParallel) and head.output_layouts == (Replicate(),)
    tied = builtin_tp_plan(tiny("qwen2", tie_word_embeddings=True))
    assert tied["lm_head"] is None  # one weight with the whole embedding: kept whole


def test_a_transformers_plan_style_air_does_not_translate_is_refused(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    model = tiny("llama")
    model.config.base_model_tp_plan = {
        **model.config.base_model_tp_plan,
        "layers.*.mlp.gate_proj": "local_colwise",
    }
    with pytest.raises(
        ConfigError,
        match=r"asks 'model.layers.\*.mlp.gate_proj': 'local_colwise', which AIR does not"
        r" translate .*pass tp_plan=",
    ):
        air.parallelize(model)


def test_a_transformers_model_under_tp_splits_its_projections(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    model = air.parallelize(tiny("llama"))
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.weight.to_local().shape == (16, 32)  # 2 of 4 heads of 8
    assert attention.k_proj.weight.to_local().shape == (8, 32)  # 1 of 2 kv heads
