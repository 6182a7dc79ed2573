"""Resuming a `ShardedDataset`: the position saved is one integer (global samples of the
epoch consumed by the loop), so a resume on another number of ranks or workers consumes
exactly the samples the uninterrupted run had left; reaching it costs the same at any
position (reads are counted); `air.checkpoint` saves and restores it with the state."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from shard_files import SEQ_LEN, token_ids, token_shards

from air_sdk.errors import ConfigError
from air_sdk.runtime import checkpoint
from air_sdk.runtime.checkpoint import Checkpointer
from air_sdk.runtime.data import ShardedDataset, StreamLoader, loader, write_index

# DataLoader workers are forked from the test process: run before other tests (conftest.py)
pytestmark = pytest.mark.forks_workers

torch = pytest.importorskip("torch")
BATCH = 3


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = token_shards(tmp_path_factory.mktemp("tokens"))
    write_index(root)
    return root


def streams(root: Path, dp_size: int, num_workers: int, **kwargs: Any) -> list[StreamLoader]:
    return [
        loader(
            ShardedDataset(
                root,
                seq_len=SEQ_LEN,
                seed=5,
                shuffle_block=16,
                dp_rank=r,
                dp_size=dp_size,
                **kwargs,
            ),
            BATCH,
            num_workers=num_workers,
        )
        for r in range(dp_size)
    ]


def interleaved(per_rank: list[list[int]]) -> list[int]:
    size = len(per_rank)
    return [per_rank[p % size][p // size] for p in range(size * len(per_rank[0]))]


def consume(ranks: list[StreamLoader], steps: int | None) -> list[int]:
    """Every rank takes `steps` batches (None: to the epoch's end), as a training loop
    does; the samples consumed, in global order."""
    per_rank = []
    for stream in ranks:
        taken = itertools.islice(stream, steps) if steps is not None else stream
        per_rank.append([token_ids(s) for batch in taken for s in batch])
    return interleaved(per_rank)


def full_order(root: Path) -> list[int]:
    return consume(streams(root, 1, 0), None)


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 1), (1, 0)), ((1, 0), (2, 3)), ((4, 0), (2, 1)), ((2, 3), (4, 1))],
    ids=["2x1-to-1x0", "1x0-to-2x3", "4x0-to-2x1", "2x3-to-4x1"],
)
def test_a_resume_on_other_ranks_and_workers_consumes_exactly_the_rest(
    shards: Path, before: tuple[int, int], after: tuple[int, int]
) -> None:
    order = full_order(shards)
    first = streams(shards, *before)
    head = consume(first, 4)
    states = [stream.state_dict() for stream in first]
    assert all(state == states[0] for state in states)  # the ranks agree
    assert states[0]["position"] == 4 * BATCH * before[0] == len(head)

    second = streams(shards, *after)
    for stream in second:
        stream.load_state_dict(json.loads(json.dumps(states[0])))  # as the manifest keeps it
    tail = consume(second, None)
    union = head + tail
    assert len(set(union)) == len(union)  # no sample twice
    assert union == order[: len(union)]  # no gap, in the uninterrupted order
    assert len(order) - len(union) < after[0]  # only the epoch's last < dp_size dropped
    assert all(stream.epoch == 1 and stream.position == 0 for stream in second)


def test_workers_prefetching_do_not_move_the_position(shards: Path) -> None:
    (stream,) = streams(shards, 1, 2)
    taken = list(itertools.islice(stream, 2))  # the workers made more than 2 by now
    assert stream.state_dict()["position"] == 2 * BATCH == sum(len(b) for b in taken)


def test_an_epoch_ends_at_epoch_plus_one_and_set_epoch_keeps_a_restored_position(
    shards: Path,
) -> None:
    (stream,) = streams(shards, 1, 0)
    list(stream)
    assert (stream.epoch, stream.position) == (1, 0)
    stream.load_state_dict({**stream.state_dict(), "epoch": 3, "position": 10})
    stream.set_epoch(3)
    assert stream.position == 10
    stream.set_epoch(4)
    assert (stream.epoch, stream.position) == (4, 0)


def test_resume_cost_does_not_grow_with_the_position(tmp_path: Path) -> None:
    root = token_shards(tmp_path, sizes=(200, 200, 200, 200))
    write_index(root)
    costs = []
    for position in (0, 400, 795):
        data = ShardedDataset(root, seq_len=SEQ_LEN, shuffle_block=20, dp_rank=0, dp_size=1)
        data.load_state_dict({**data.state_dict(), "position": position})
        batch = next(iter(loader(data, 4)))
        assert len(batch) == 4
        costs.append((data.num_reads, data.order().num_blocks_computed, data.num_shard_opens <= 2))
    assert costs == [(4, 1, True)] * 3  # 4 samples read, 1 block permuted, whatever the position


def test_a_different_seed_or_data_is_refused_with_the_value_to_use(shards: Path) -> None:
    (stream,) = streams(shards, 1, 0)
    state = stream.state_dict()
    (other,) = streams(shards, 1, 0, shuffle=False)
    with pytest.raises(
        ConfigError, match="had shuffle=True, this one has shuffle=False.*shuffle=True"
    ):
        other.load_state_dict(state)
    with pytest.raises(ConfigError, match="had num_samples=3, .* read the same shards"):
        stream.load_state_dict({**state, "num_samples": 3})
    with pytest.raises(ConfigError, match="version 7"):
        stream.load_state_dict({**state, "version": 7})


@pytest.fixture
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AIR_CHECKPOINT_DIR", "AIR_CHECKPOINT_KEEP", "RANK", "WORLD_SIZE", "AIR_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checkpoint, "_default", None)


def test_air_checkpoint_saves_the_position_and_a_resume_goes_on_from_it(
    shards: Path, tmp_path: Path, one_process: None
) -> None:
    order = full_order(shards)
    ckpt = Checkpointer(tmp_path / "ckpt")
    (stream,) = streams(shards, 1, 1)
    model = torch.nn.Linear(2, 2)
    state = {"model": model, "data": stream}
    head = consume([stream], 5)
    ckpt.save(state, step=5)
    assert ckpt.wait() == 5
    manifest = json.loads((tmp_path / "ckpt" / "step-5" / "manifest.json").read_text())
    assert manifest["data_position"]["data"]["position"] == 5 * BATCH
    assert manifest["data_position"]["data"]["epoch"] == 0

    (fresh,) = streams(shards, 1, 0)
    resumed = {"model": torch.nn.Linear(2, 2), "data": fresh}
    assert ckpt.load(resumed) == 5
    assert resumed["data"] is fresh and fresh.position == 5 * BATCH
    assert head + consume([fresh], None) == order
