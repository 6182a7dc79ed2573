"""Process-group fixtures for the parallelism tests (imported by the conftest.py of the
test folders that use them): a fake world of N ranks in this process (torch's own
FakeProcessGroup: meshes, DTensor and FSDP set-up without collectives doing any work)
and a real 1-rank gloo world."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest


def _reset() -> None:
    import torch.distributed as dist

    from air_sdk.runtime.parallel.meshes import _forget_meshes

    _forget_meshes()
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def fake_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    """Call with a world size: this process becomes rank 0 of a fake world that size."""
    pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    monkeypatch.delenv("AIR_PARALLELISM", raising=False)

    def start(world_size: int) -> None:
        _reset()
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())

    yield start
    _reset()


@pytest.fixture
def gloo_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real 1-rank gloo process group in this process."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    for name in ("AIR_PARALLELISM", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    _reset()
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    _reset()
