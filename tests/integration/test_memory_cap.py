"""A model bigger than one rank's memory trains: every rank's memory is capped
(RLIMIT_DATA: the data segment and private anonymous mappings, what torch's CPU
allocator takes; RLIMIT_AS would count the hundreds of MB of virtual address space torch
reserves, and cgroup v2's memory.max is not writable here) at its start-up size plus
5/6 of the model's bytes. Built on the meta device, FSDP4 and TP2 x FSDP2 train the
~840 MB model (each rank holds a quarter of its parameters and gradients, plus one
block in flight); built eagerly under the same cap it fails, which shows the cap binds.

glibc's dynamic mmap threshold would keep freed blocks of up to 32 MB in the heap,
counted by RLIMIT_DATA long after torch let them go; a fixed 1 MB threshold
(`MALLOC_MMAP_THRESHOLD_`, inherited by the spawned ranks) returns them at once.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

import metaranks  # noqa: E402  (imports torch)

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model_bytes() -> int:
    with torch.device("meta"):
        model = metaranks.build_llama(metaranks.BIG)
    return 4 * sum(p.numel() for p in model.parameters())


def _run(tmp_path: Path, layout: str, meta: bool) -> list[dict]:
    out = tmp_path / f"{layout}-{'meta' if meta else 'eager'}"
    out.mkdir()
    extra = _model_bytes() * 5 // 6
    mp.start_processes(
        metaranks.capped_training,
        args=(_free_port(), str(out), layout, meta, extra),
        nprocs=metaranks.WORLD,
        join=True,
        start_method="spawn",
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(metaranks.WORLD)]


@pytest.fixture(autouse=True)
def _fixed_mmap_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))


def test_the_model_is_bigger_than_the_cap_and_its_shard_smaller() -> None:
    model = _model_bytes()
    assert model > 800 * 2**20
    assert model // metaranks.WORLD < model * 5 // 6 < model


@pytest.mark.parametrize("layout", sorted(metaranks.BIG_LAYOUTS))
def test_built_on_meta_it_trains_under_the_cap(tmp_path: Path, layout: str) -> None:
    ranks = _run(tmp_path, layout, meta=True)
    assert all(rank["ok"] for rank in ranks), [r.get("error") for r in ranks]
    losses = {round(rank["loss"], 4) for rank in ranks}
    assert len(losses) == 1 and torch.isfinite(torch.tensor(losses.pop()))


def test_built_eagerly_under_the_same_cap_it_fails(tmp_path: Path) -> None:
    ranks = _run(tmp_path, "FSDP4", meta=False)
    for rank in ranks:
        assert not rank["ok"]
        assert "can't allocate memory" in rank["error"]
