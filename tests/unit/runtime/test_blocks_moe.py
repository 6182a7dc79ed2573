"""The blocks of a mixture-of-experts model are its decoder layers, not the experts list
inside one (it has more children): FSDP units are the layers, a pipeline splits at
layers and its stages chain to the whole model, and `blocks=` names the container when
the choice should be another."""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

import air_sdk.runtime as air  # noqa: E402
from air_sdk.runtime.parallel.blocks import build_stage, find_blocks, split_stages  # noqa: E402

DIM, VOCAB, LAYERS, EXPERTS = 8, 32, 4, 8


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class MoELayer(nn.Module):
    """A router and 8 experts (top-1), with a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.router = nn.Linear(DIM, EXPERTS)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        choice = self.router(h).argmax(-1)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            mask = (choice == i).unsqueeze(-1)
            out = out + mask * expert(h)
        return x + out


class TinyMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(MoELayer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def tiny_moe() -> TinyMoE:
    torch.manual_seed(0)
    return TinyMoE()


def test_the_blocks_are_the_layers_not_the_experts_inside_one():
    blocks = find_blocks(tiny_moe())
    assert (blocks.path, blocks.names, blocks.block_class) == (
        "layers",
        ("0", "1", "2", "3"),
        MoELayer,
    )


def test_fsdp_units_are_the_moe_layers(fake_world):
    fake_world(2)
    model = air.parallelize(tiny_moe())
    units = sorted(name for name, m in model.named_modules() if isinstance(m, FSDPModule))
    assert units == ["", "layers.0", "layers.1", "layers.2", "layers.3"]


def test_a_pipeline_splits_at_the_layers_and_its_stages_chain_to_the_whole_model():
    model = tiny_moe()
    split = split_stages(model, 2)
    assert split.blocks_path == "layers"
    assert split.blocks == (("0", "1"), ("2", "3"))  # embeddings and head count as one each
    assert (split.first_modules, split.last_modules) == (("embed",), ("norm", "head"))
    tokens = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    first, last = build_stage(model, split, 0), build_stage(model, split, 1)
    with torch.no_grad():
        torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)


def test_blocks_names_the_container_and_a_wrong_one_is_refused_with_what_it_holds(fake_world):
    model = tiny_moe()
    assert find_blocks(model, "layers.0.experts").block_class is Expert
    assert find_blocks(model, "layers").names == ("0", "1", "2", "3")
    with pytest.raises(ConfigError, match=r"blocks='model.layers': TinyMoE has no module there"):
        find_blocks(model, "model.layers")
    with pytest.raises(
        ConfigError,
        match=r"blocks='layers.0' is a MoELayer holding LayerNorm, Linear, ModuleList: give",
    ):
        find_blocks(model, "layers.0")
    fake_world(2)
    sharded = air.parallelize(tiny_moe(), blocks="layers.1.experts")
    units = {name for name, m in sharded.named_modules() if isinstance(m, FSDPModule)}
    assert units == {"", *(f"layers.1.experts.{i}" for i in range(EXPERTS))}


def test_a_real_transformers_moe_is_split_at_its_decoder_layers(fake_world):
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    blocks = find_blocks(model)
    assert (blocks.path, blocks.block_class.__name__) == ("model.layers", "MixtralDecoderLayer")
    split = split_stages(model, 2)
    assert split.blocks_path == "model.layers" and split.blocks == (("0", "1"), ("2", "3"))
    fake_world(2)
    sharded = air.parallelize(model)
    units = sorted(name for name, m in sharded.named_modules() if isinstance(m, FSDPModule))
    assert units == ["", *(f"model.layers.{i}" for i in range(4))]


def test_a_pipeline_of_the_moe_trains_like_the_model_and_takes_blocks(gloo_world):
    tokens = torch.randint(0, VOCAB, (4, 5), generator=torch.Generator().manual_seed(2))
    targets = torch.roll(tokens, 1, dims=1)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    expected = loss_fn(tiny_moe()(tokens), targets)
    pipe = air.pipeline(tiny_moe(), microbatches=2, loss_fn=loss_fn, blocks="layers")
    assert type(pipe.model_parts[0].layers).__name__ == "StageLayers"
    loss = pipe.step(tokens, targets)
    assert loss is not None
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
