"""Exact data resume: a resumed sampler or loader continues with exactly the samples an
uninterrupted run would have seen, without iterating (or loading) its way there."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from air_sdk.runtime.data import (  # noqa: E402
    ResumableLoader,
    StatefulDistributedSampler,
    resumable_loader,
)

# DataLoader workers are forked from the test process: run before other tests (conftest.py)
pytestmark = pytest.mark.forks_workers


class CountingDataset(torch.utils.data.Dataset):
    """Sample i is i; counts every __getitem__ call."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.calls += 1
        return i


def epochs_of(sampler: Any, num_epochs: int) -> list[Any]:
    """Everything an uninterrupted training loop would draw over `num_epochs` epochs."""
    seen = []
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        seen.extend(sampler)
    return seen


def resumed_run(make: Any, cut: int, num_epochs: int) -> list[Any]:
    """Draw `cut` items, checkpoint, then continue in a fresh object from the state."""
    first = make()
    seen: list[Any] = []
    state = None
    for epoch in range(num_epochs):
        first.set_epoch(epoch)
        for item in first:
            seen.append(item)
            if len(seen) == cut:
                state = first.state_dict()
                break
        if state is not None:
            break
    assert state is not None
    second = make()
    second.load_state_dict(state)
    for epoch in range(second.epoch, num_epochs):
        second.set_epoch(epoch)  # the saved epoch again keeps the saved position
        seen.extend(second)
    return seen


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_prefix_plus_resumed_suffix_is_the_uninterrupted_sequence(
    rank: int, batch_size: int, drop_last: bool
) -> None:
    def make() -> StatefulDistributedSampler:
        return StatefulDistributedSampler(
            11, num_replicas=2, rank=rank, seed=3, drop_last=drop_last, batch_size=batch_size
        )

    num_epochs = 3
    full = epochs_of(make(), num_epochs)
    per_epoch = len(make())
    # every cut: first item, mid-epoch, the last of an epoch (boundary), the very end
    for cut in range(1, len(full) + 1):
        assert resumed_run(make, cut, num_epochs) == full, f"cut after {cut} of {per_epoch}/epoch"


def test_the_order_is_distributed_samplers_and_replicas_split_each_epoch() -> None:
    for epoch in range(2):
        shares = []
        for rank in range(2):
            ours = StatefulDistributedSampler(10, num_replicas=2, rank=rank, seed=5)
            ours.set_epoch(epoch)
            theirs = torch.utils.data.DistributedSampler(
                range(10), num_replicas=2, rank=rank, seed=5
            )
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            shares.append(ours.rank_indices(epoch).tolist())
        assert sorted(shares[0] + shares[1]) == list(range(10))
    one = StatefulDistributedSampler(10, num_replicas=1, rank=0, seed=5)
    one.set_epoch(1)
    assert list(one) != list(range(10))  # reshuffled per epoch


def test_padding_and_drop_last_give_every_replica_the_same_count() -> None:
    padded = [list(StatefulDistributedSampler(5, num_replicas=2, rank=r)) for r in (0, 1)]
    assert [len(p) for p in padded] == [3, 3]
    assert set(padded[0] + padded[1]) == set(range(5))
    dropped = [
        list(StatefulDistributedSampler(5, num_replicas=2, rank=r, drop_last=True)) for r in (0, 1)
    ]
    assert [len(d) for d in dropped] == [2, 2]
    assert len(set(dropped[0] + dropped[1])) == 4


def test_state_is_plain_and_the_same_on_every_rank() -> None:
    states = []
    for rank in range(2):
        sampler = StatefulDistributedSampler(20, num_replicas=2, rank=rank, batch_size=2)
        list(itertools.islice(iter(sampler), 3))
        states.append(sampler.state_dict())
    assert states[0] == states[1]
    assert states[0]["epoch"] == 0 and states[0]["index"] == 6
    assert all(isinstance(v, int | bool) for v in states[0].values())


def test_a_changed_seed_or_dataset_is_refused_with_what_to_change() -> None:
    state = StatefulDistributedSampler(20, num_replicas=2, rank=0, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed=1"):
        StatefulDistributedSampler(20, num_replicas=2, rank=0, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset_len=20"):
        StatefulDistributedSampler(21, num_replicas=2, rank=0, seed=1).load_state_dict(state)


def test_another_number_of_replicas_continues_at_the_same_share_of_the_epoch() -> None:
    sampler = StatefulDistributedSampler(40, num_replicas=4, rank=0)
    list(itertools.islice(iter(sampler), 5))  # 5 of 10 per rank: half the epoch
    resumed = StatefulDistributedSampler(40, num_replicas=2, rank=0)
    with pytest.warns(UserWarning, match="4 replicas"):
        resumed.load_state_dict(sampler.state_dict())
    assert resumed.index == 10 and len(list(resumed)) == 10  # the other half of 20


# 3 batches per rank and epoch: a cut after 3 is an epoch boundary; workers cost ~1 s a case
@pytest.mark.parametrize(("num_workers", "cut"), [(0, 1), (0, 3), (0, 4), (0, 5), (2, 4)])
def test_a_resumed_loader_sees_exactly_the_rest_and_loads_nothing_twice(
    num_workers: int, cut: int
) -> None:
    def make(dataset: CountingDataset) -> ResumableLoader:
        return resumable_loader(
            dataset, batch_size=4, num_replicas=2, rank=1, seed=9, num_workers=num_workers
        )

    num_epochs = 2
    full = [b.tolist() for b in epochs_of(make(CountingDataset(21)), num_epochs)]
    first = make(CountingDataset(21))
    prefix, state = [], None
    for epoch in range(num_epochs):
        first.set_epoch(epoch)
        for batch in first:  # workers prefetch ahead; the state counts delivered batches
            prefix.append(batch.tolist())
            if len(prefix) == cut:
                state = first.state_dict()
                break
        if state is not None:
            break
    dataset = CountingDataset(21)
    second = make(dataset)
    second.load_state_dict(state)
    suffix = []
    for epoch in range(second.epoch, num_epochs):
        second.set_epoch(epoch)
        suffix.extend(b.tolist() for b in second)
    assert prefix + suffix == full
    if num_workers == 0:  # worker processes count in their own copies of the dataset
        assert dataset.calls == sum(len(b) for b in suffix)  # no skip-ahead loading


def test_resumable_loader_refuses_options_it_sets_itself() -> None:
    with pytest.raises(TypeError, match="sampler"):
        resumable_loader(list(range(4)), num_replicas=1, rank=0, sampler=None)
    with pytest.raises(ValueError, match="rank 2"):
        StatefulDistributedSampler(4, num_replicas=2, rank=2)


def test_defaults_come_from_the_launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    sampler = StatefulDistributedSampler(9)
    assert (sampler.rank, sampler.num_replicas, sampler.num_samples) == (1, 3, 3)
