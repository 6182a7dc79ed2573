"""Tensor-parallel plans and `air.parallelize`'s refusals, on a fake world of ranks in this
process (torch's FakeProcessGroup: the set-up runs for real, collectives do nothing)."""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError
from air_sdk.schema import Parallelism

torch = pytest.importorskip("torch")
nn = torch.nn

from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
)

import air_sdk.runtime as air  # noqa: E402
from air_sdk.examples.llama import LlamaConfig, build_llama  # noqa: E402
from air_sdk.runtime.parallel.blocks import find_blocks  # noqa: E402
from air_sdk.runtime.parallel.plans import (  # noqa: E402
    GatherSequence,
    builtin_plan,
    check_coverage,
    expand_plan,
)

HF_BLOCK = {
    "input_layernorm": SequenceParallel,
    "self_attn": GatherSequence,
    "self_attn.q_proj": ColwiseParallel,
    "self_attn.k_proj": ColwiseParallel,
    "self_attn.v_proj": ColwiseParallel,
    "self_attn.o_proj": RowwiseParallel,
    "post_attention_layernorm": SequenceParallel,
    "mlp": GatherSequence,
    "mlp.gate_proj": ColwiseParallel,
    "mlp.up_proj": ColwiseParallel,
    "mlp.down_proj": RowwiseParallel,
}
TITAN_BLOCK = {
    "attention_norm": SequenceParallel,
    "attention": GatherSequence,
    "attention.wq": ColwiseParallel,
    "attention.wk": ColwiseParallel,
    "attention.wv": ColwiseParallel,
    "attention.wo": RowwiseParallel,
    "ffn_norm": SequenceParallel,
    "feed_forward": GatherSequence,
    "feed_forward.w1": ColwiseParallel,
    "feed_forward.w3": ColwiseParallel,
    "feed_forward.w2": RowwiseParallel,
}


@pytest.mark.parametrize(
    ("naming", "prefix", "block_plan", "outer"),
    [
        ("titan", "layers", TITAN_BLOCK, ("tok_embeddings", "norm", "output")),
        ("hf", "model.layers", HF_BLOCK, ("model.embed_tokens", "model.norm", "lm_head")),
    ],
)
def test_builtin_plans_cover_both_namings(naming, prefix, block_plan, outer):
    model = build_llama(LlamaConfig(naming=naming, n_layers=2))
    plan, scheme = builtin_plan(model, find_blocks(model))
    assert scheme.name == naming
    expected = {f"{prefix}.{i}.{name}": kind for i in (0, 1) for name, kind in block_plan.items()}
    embedding, norm, head = outer
    expected |= {embedding: RowwiseParallel, norm: SequenceParallel, head: ColwiseParallel}
    assert {path: type(style) for path, style in plan.items()} == expected
    # sequence parallel between blocks: the last projections scatter back to sequence shards
    assert plan[f"{prefix}.0.{list(block_plan)[5]}"].output_layouts == (Shard(1),)
    assert plan[embedding].output_layouts == (Shard(1),)
    assert plan[head].output_layouts == (Replicate(),)  # logits whole: any loss works
    check_coverage(model, plan, tp=2)  # nothing left out


def test_user_plan_keys_take_wildcards_and_must_match_something():
    model = build_llama(LlamaConfig(n_layers=2))
    plan = expand_plan(model, {"layers.*.attention.wq": ColwiseParallel(), "norm": None})
    assert sorted(plan) == ["layers.0.attention.wq", "layers.1.attention.wq", "norm"]
    with pytest.raises(
        ConfigError, match=r"tp_plan key 'layers.\*.attn.wq' matches no module of TitanLlama"
    ):
        expand_plan(model, {"layers.*.attn.wq": ColwiseParallel()})
    with pytest.raises(ConfigError, match=r"tp_plan\['norm'\] is str: give a ParallelStyle"):
        expand_plan(model, {"norm": "colwise"})


class GatedBlock(nn.Module):
    """A Llama block with one more projection that no built-in rule knows."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.attention_norm, self.attention = inner.attention_norm, inner.attention
        self.ffn_norm, self.feed_forward = inner.ffn_norm, inner.feed_forward
        self.attention.gate = nn.Linear(64, 64, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


def gated_llama() -> nn.Module:
    model = build_llama(LlamaConfig(n_layers=2))
    model.layers = nn.ModuleList(GatedBlock(block) for block in model.layers)
    return model


def test_a_linear_no_rule_covers_is_named_and_tp_plan_is_suggested(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    with pytest.raises(
        ConfigError,
        match=r"tp=2: no tensor-parallel rule covers layers\.\*\.attention\.gate \(Linear\): .*pass tp_plan=",
    ):
        air.parallelize(gated_llama())


def test_an_extended_builtin_plan_keeps_the_extra_projection_whole(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    model = gated_llama()
    plan = {**air.parallel.builtin_tp_plan(model), "layers.*.attention.gate": None}
    air.parallelize(model, tp_plan=plan)
    assert not isinstance(model.layers[0].attention.gate.weight, DTensor)
    assert isinstance(model.layers[0].attention.wq.weight, DTensor)


def test_blocks_of_another_naming_need_a_plan(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

    model = nn.Sequential(nn.Embedding(8, 4), nn.ModuleList(Block() for _ in range(2)))
    with pytest.raises(
        ConfigError,
        match=r"no built-in tensor-parallel plan fits Block \(children: proj\).*pass tp_plan=",
    ):
        air.parallelize(model)


def test_tp_divides_the_head_counts_of_both_namings(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    titan = air.parallelize(build_llama(LlamaConfig(n_heads=4, n_kv_heads=2)))
    hf = air.parallelize(build_llama(LlamaConfig(naming="hf", n_heads=4, n_kv_heads=2)))
    assert (titan.layers[0].attention.n_heads, titan.layers[0].attention.n_kv_heads) == (2, 1)
    attention = hf.model.layers[0].self_attn
    assert (attention.num_heads, attention.num_key_value_heads) == (2, 1)
    assert attention.q_proj.weight.to_local().shape == (32, 64)  # 2 of 4 heads of 16


def test_heads_that_do_not_divide_by_tp_are_refused(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    with pytest.raises(
        ConfigError, match=r"layers.0.attention: n_kv_heads=1 is not a multiple of tp=2"
    ):
        air.parallelize(build_llama(LlamaConfig(n_heads=4, n_kv_heads=1)))


def test_fsdp_wraps_every_block_then_the_root_and_hsdp_uses_two_dims(fake_world):
    fake_world(8)
    air.mesh(Parallelism(dp_replicate=2, tp=2))
    model = air.parallelize(build_llama(LlamaConfig(naming="hf")))
    assert isinstance(model, FSDPModule)
    assert all(isinstance(block, FSDPModule) for block in model.model.layers)
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert weight.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "tp")
    replicated, sharded, tensor_parallel = weight.placements  # HSDP: replicate, then shard
    assert replicated.is_replicate() and tensor_parallel.is_shard(0)
    assert sharded.dim == 0  # FSDP's shard of TP's shard (a strided shard)
    assert weight.to_local().shape == (16, 64)  # 64 rows / (dp_shard 2 x tp 2)


def test_parallelize_refusals_say_what_to_change(fake_world):
    fake_world(4)
    air.mesh(Parallelism(pp=2))
    with pytest.raises(ConfigError, match=r"pp=2: a pipeline needs stages.*air.pipeline\(model"):
        air.parallelize(build_llama(LlamaConfig()))
    air.mesh(Parallelism())
    model = air.parallelize(build_llama(LlamaConfig()))
    with pytest.raises(
        ConfigError, match=r"TitanLlama is parallelized already.*call air.parallelize once"
    ):
        air.parallelize(model)
    with pytest.raises(ConfigError, match=r"mixed_precision='fp16': use 'auto', 'bf16', 'fp32'"):
        air.parallelize(build_llama(LlamaConfig()), mixed_precision="fp16")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"activation_checkpointing='op': use False, True"):
        air.parallelize(build_llama(LlamaConfig()), activation_checkpointing="op")  # type: ignore[arg-type]


def test_state_dict_keys_stay_the_plain_models_under_tp_fsdp_and_ac(fake_world):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from air_sdk.examples.llama import loss_fn, synthetic_batch

    fake_world(4)
    air.mesh(Parallelism(tp=2))
    config = LlamaConfig(naming="hf", n_kv_heads=2)
    model = air.parallelize(build_llama(config), activation_checkpointing=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens, targets = synthetic_batch(config, batch_size=2, seq_len=8, step=0)
    loss_fn(model(tokens), targets).backward()
    optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    plain = set(build_llama(config).state_dict())
    assert set(model_state) == plain
    assert set(optim_state["state"]) == plain  # AdamW state per parameter, same names
    assert isinstance(model_state["model.layers.0.self_attn.q_proj.weight"], DTensor)


def test_a_pipeline_takes_a_user_plan_checked_against_the_whole_model(fake_world):
    from air_sdk.examples.llama import loss_fn

    fake_world(4)
    air.mesh(Parallelism(pp=2, tp=2))
    model = build_llama(LlamaConfig(n_kv_heads=2))
    plan = air.parallel.builtin_tp_plan(model)  # concrete paths of every stage's blocks
    pipe = air.pipeline(model, microbatches=2, loss_fn=loss_fn, tp_plan=plan)
    (part,) = pipe.model_parts  # rank 0: stage 0 of 2
    assert [name for name, _ in part.layers.named_children()] == ["0", "1"]
    assert isinstance(part.layers[1].attention.wq.weight, DTensor)
    assert part.layers[0].attention.n_heads == 2  # 4 heads over tp=2
    assert type(part.output).__name__ == "Identity"
    with pytest.raises(ConfigError, match=r"tp_plan key 'layers.\*.attn.wq' matches no module"):
        air.pipeline(model, microbatches=2, loss_fn=loss_fn, tp_plan={"layers.*.attn.wq": None})


def test_too_few_microbatches_for_the_schedule_are_refused(fake_world):
    from air_sdk.examples.llama import loss_fn

    fake_world(2)
    air.mesh(Parallelism(pp=2))
    with pytest.raises(
        ConfigError, match=r"1F1B with 2 stages and microbatches=1: .*change microbatches"
    ):
        air.pipeline(build_llama(LlamaConfig()), microbatches=1, loss_fn=loss_fn)


def test_the_builtin_plan_needs_the_embedding_and_the_head(fake_world):
    fake_world(2)
    air.mesh(Parallelism(tp=2))
    model = build_llama(LlamaConfig(n_layers=1))
    model.output = nn.Identity()  # a backbone without its head
    with pytest.raises(
        ConfigError,
        match=r"built-in titan tensor-parallel plan needs the output head 'output' next to 'layers' or on the model, and TitanLlama has none: pass tp_plan=",
    ):
        air.parallelize(model)


def test_gather_sequence_names_a_module_called_without_a_tensor(fake_world):
    from torch.distributed.tensor.parallel import parallelize_module

    fake_world(2)
    air.mesh(Parallelism(tp=2))

    class TakesNoTensor(nn.Module):
        def forward(self, n: int) -> int:
            return n

    module = parallelize_module(TakesNoTensor(), air.submesh("tp"), GatherSequence())
    with pytest.raises(ConfigError, match=r"GatherSequence on TakesNoTensor: no tensor input"):
        module(3)
