"""Block discovery and the pipeline's stage split (no process group needed)."""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError

torch = pytest.importorskip("torch")
nn = torch.nn

from air_sdk.examples.llama import LlamaConfig, build_llama, synthetic_batch  # noqa: E402
from air_sdk.runtime.parallel.blocks import (  # noqa: E402
    StageLayers,
    build_stage,
    find_blocks,
    split_stages,
)


@pytest.mark.parametrize(
    ("naming", "path", "block"),
    [("titan", "layers", "TitanBlock"), ("hf", "model.layers", "HFDecoderLayer")],
)
def test_the_repeated_blocks_are_found_in_both_namings(naming, path, block):
    blocks = find_blocks(build_llama(LlamaConfig(naming=naming, n_layers=3)))
    assert (blocks.path, blocks.names, blocks.block_class.__name__) == (
        path,
        ("0", "1", "2"),
        block,
    )


def test_the_largest_list_of_one_class_wins_and_dicts_count():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])  # 2 of one class
            self.mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.ReLU()])
            self.blocks = nn.ModuleDict({f"b{i}": nn.Sequential(nn.Linear(2, 2)) for i in range(3)})

    blocks = find_blocks(Model())
    assert blocks.path == "blocks" and blocks.names == ("b0", "b1", "b2")


def test_a_model_without_repeated_blocks_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"Sequential has no nn.ModuleList or nn.ModuleDict"):
        find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


def test_stages_are_balanced_with_embeddings_and_head_counted_as_blocks():
    model = build_llama(LlamaConfig(naming="hf", n_layers=4))
    two = split_stages(model, 2)
    assert two.blocks == (("0", "1"), ("2", "3"))
    assert two.first_modules == ("model.embed_tokens",)
    assert two.last_modules == ("model.norm", "lm_head")
    assert split_stages(model, 4).blocks == (("0",), ("1", "2"), ("3",), ())
    assert split_stages(model, 1).blocks == (("0", "1", "2", "3"),)


def test_more_stages_than_pieces_is_refused():
    with pytest.raises(
        ConfigError, match=r"5 pipeline stages but TitanLlama has 2 blocks .* = 4 pieces"
    ):
        split_stages(build_llama(LlamaConfig(n_layers=2)), 5)


def test_tied_embedding_and_head_are_refused_with_the_line_that_unties_them():
    model = build_llama(LlamaConfig(n_layers=2))
    model.output.weight = model.tok_embeddings.weight
    with pytest.raises(
        ConfigError, match=r"'tok_embeddings.weight' and 'output.weight' are one tied"
    ) as refused:
        split_stages(model, 2)
    line = str(refused.value).split("Untie it before air.pipeline: ", 1)[1].split(". The", 1)[0]
    assert line == (
        "model.output.weight = torch.nn.Parameter(model.tok_embeddings.weight.detach().clone())"
    )
    exec(line)
    assert model.output.weight is not model.tok_embeddings.weight
    assert torch.equal(model.output.weight, model.tok_embeddings.weight)
    assert split_stages(model, 2).last_modules == ("norm", "output")


def test_parameters_beside_the_blocks_are_refused():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(2))
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

    with pytest.raises(
        ConfigError, match=r"parameter 'scale' sits on Model, which also holds the blocks"
    ):
        split_stages(Model(), 2)


@pytest.mark.parametrize("naming", ["titan", "hf"])
def test_stages_chained_compute_the_whole_model_and_keep_its_names(naming):
    config = LlamaConfig(naming=naming, n_layers=4)
    model = build_llama(config)
    split = split_stages(model, 3)
    stages = [build_stage(model, split, i) for i in range(3)]
    keys = [set(stage.state_dict()) for stage in stages]
    assert set().union(*keys) == set(model.state_dict())  # every key once, under its own name
    assert sum(len(k) for k in keys) == len(model.state_dict())
    tokens, _ = synthetic_batch(config, batch_size=2, seq_len=8, step=0)
    hidden = tokens
    for stage in stages:
        hidden = stage(hidden)
    torch.testing.assert_close(hidden, model(tokens), rtol=0, atol=0)


def test_stage_layers_iterate_like_the_list_they_replace():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    kept = StageLayers({"4": a, "5": b})
    assert list(kept) == [a, b] and len(kept) == 2 and kept[1] is b and kept[:1] == [a]
    assert [name for name, _ in kept.named_children()] == ["4", "5"]


def test_the_docstring_examples_of_the_parallel_room_run():
    import doctest

    from air_sdk.runtime.parallel import apply, blocks, context, meshes, pipelines, plans

    for module in (apply, blocks, context, meshes, pipelines, plans):
        assert doctest.testmod(module, raise_on_error=False).failed == 0, module.__name__


def test_stage_counts_and_indices_out_of_range_are_refused():
    model = build_llama(LlamaConfig(n_layers=2))
    with pytest.raises(ConfigError, match=r"num_stages=0: give at least 1"):
        split_stages(model, 0)
    with pytest.raises(ConfigError, match=r"stage 2 of 2: no such stage"):
        build_stage(model, split_stages(model, 2), 2)
