"""Selective activation checkpointing keeps torchtitan's ops (matmuls with and without
bias, attention) and recomputes the rest: what a forward leaves alive for the backward
lies strictly between no checkpointing and full checkpointing, for the tiny Llama and
for a model of biased `nn.Linear`s (`addmm`, which a list of `mm` alone misses)."""

from __future__ import annotations

import weakref

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn  # noqa: E402


class _Outputs(TorchDispatchMode):
    """Weak references to every tensor an op makes."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[weakref.ref[torch.Tensor]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.refs.append(weakref.ref(t))
        return out


def _kept_bytes(model: nn.Module, run) -> int:  # type: ignore[no-untyped-def]
    """Bytes of the distinct storages still alive after the forward (weights excluded):
    what the autograd graph and checkpointing keep for the backward."""
    owned = {p.untyped_storage().data_ptr() for p in model.parameters()}
    mode = _Outputs()
    with mode:
        loss = run()
    alive = {}
    for ref in mode.refs:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in owned:
            alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    del loss
    return sum(alive.values())


class _BiasedBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)).sin())


class _BiasedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_BiasedBlock(32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _llama_run(mode):  # type: ignore[no-untyped-def]
    import air_sdk.runtime.parallel as parallel

    config = LlamaConfig(n_layers=2, dim=64, hidden_dim=128, max_seq_len=64)
    model = parallel.parallelize(
        build_llama(config), activation_checkpointing=mode, mixed_precision="fp32"
    )
    tokens = torch.randint(0, config.vocab_size, (2, 64))
    return model, lambda: loss_fn(model(tokens), tokens)


def _biased_run(mode):  # type: ignore[no-untyped-def]
    import air_sdk.runtime.parallel as parallel

    torch.manual_seed(0)
    model = parallel.parallelize(
        _BiasedNet(), activation_checkpointing=mode, mixed_precision="fp32"
    )
    x = torch.randn(16, 32, requires_grad=True)
    return model, lambda: model(x).square().mean()


@pytest.mark.parametrize("build", [_llama_run, _biased_run], ids=["llama", "biased-linears"])
def test_selective_keeps_more_than_full_and_less_than_none(gloo_world, build) -> None:
    kept = {}
    for mode in ("none", "selective", "full"):
        model, run = build(mode)
        kept[mode] = _kept_bytes(model, run)
    assert kept["full"] < kept["selective"] < kept["none"], kept
