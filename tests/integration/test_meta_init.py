"""Models built on the meta device: `air.parallelize` / `air.pipeline` materialize only each
rank's shards and start every layout from the weights of a 1-rank eager build with the
same seed (real 4-rank gloo jobs: FSDP4, TP2 x FSDP2, PP2 x FSDP2, PP2 x TP2; the model's
own `init_weights()` and torch's `reset_parameters()`), and refuse a meta model that
nothing can initialize, naming the fix.

Exact equality, not a tolerance: every initializer draws each tensor whole (the tiny
Llama from a per-weight generator; `reset_parameters` on full-size stand-ins, in module
order, from the same global seed on every rank) and each rank keeps its part.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

import metaranks  # noqa: E402  (imports torch)
import torch.nn as nn  # noqa: E402

from air_sdk.errors import ConfigError  # noqa: E402
from air_sdk.examples.llama import build_llama  # noqa: E402
from air_sdk.runtime.parallel.materialize import materialize  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _eager_state(model: nn.Module) -> dict[str, torch.Tensor]:
    state = dict(model.state_dict())
    state.update({f"buffer:{n}": b for n, b in model.named_buffers()})
    return state


@pytest.mark.slow
def test_every_layout_starts_from_the_one_rank_weights(tmp_path: Path) -> None:
    mp.start_processes(
        metaranks.full_states,
        args=(_free_port(), str(tmp_path)),
        nprocs=metaranks.WORLD,
        join=True,
        start_method="spawn",
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(metaranks.WORLD)]
    expected = {
        **{name: _eager_state(build_llama(metaranks.LLAMA)) for name in metaranks.LAYOUTS},
        "plain FSDP4": _eager_state(metaranks.plain_net(0)),
    }
    for name, eager in expected.items():
        # a pipeline rank holds its stage's keys only: together the ranks hold them all
        seen: dict[str, torch.Tensor] = {}
        for rank in ranks:
            seen.update(rank[name])
        assert set(seen) == set(eager), name
        for key, value in seen.items():
            assert torch.equal(value, eager[key]), (name, key)
        for rank in ranks:  # every rank that holds a key holds the same numbers
            for key, value in rank[name].items():
                assert torch.equal(value, eager[key]), (name, key)


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))


class _NoInit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.scale = _Scale()


class _Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("inv_freq", torch.arange(2.0), persistent=False)


def test_a_parameter_nothing_initializes_is_refused_by_name() -> None:
    with torch.device("meta"):
        model = _NoInit()
    with pytest.raises(ConfigError, match=r"scale\.weight.*init_weights\(\)"):
        materialize(model, torch.device("cpu"))


def test_a_buffer_computed_in_init_is_refused_with_the_fix() -> None:
    with torch.device("meta"):
        model = _Rotary()
    with pytest.raises(ConfigError, match=r"buffers inv_freq.*recompute it in init_weights"):
        materialize(model, torch.device("cpu"))


def test_a_model_half_on_meta_is_refused() -> None:
    model = _NoInit()
    with torch.device("meta"):
        model.proj = nn.Linear(4, 4)
    from air_sdk.runtime.parallel.materialize import is_meta_model

    with pytest.raises(ConfigError, match="or none of it"):
        is_meta_model(model)


def test_a_transformers_model_on_meta_gets_its_own_init(monkeypatch) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    eager = transformers.LlamaForCausalLM(config)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    materialize(model, torch.device("cpu"))  # rotary inv_freq recomputed by _init_weights
    rotary = model.model.rotary_emb
    assert torch.equal(rotary.inv_freq, eager.model.rotary_emb.inv_freq)
    assert all(not torch.isnan(p).any() for p in model.parameters())
    tokens = torch.randint(0, 64, (1, 8))
    assert torch.isfinite(model(tokens).logits).all()
