"""Exact data resume: a distributed sampler whose position goes into the checkpoint.

```python
import air_sdk.runtime as air

loader = air.resumable_loader(dataset, batch_size=32, seed=0)  # shuffles, splits by air.layout().dp_rank
state = {"model": model, "optim": optim, "data": loader}
start = air.checkpoint.load(state) or 0
for epoch in range(loader.epoch, num_epochs):
    loader.set_epoch(epoch)            # the same epoch again keeps a restored position
    for batch in loader:               # after a resume: exactly the batches not yet seen
        ...
        air.checkpoint.save(state, step=step)
```

The position is (epoch, samples of this rank's epoch already consumed). The
epoch's order is computed from (seed, epoch) as `torch.utils.data.DistributedSampler`
computes it, so resuming starts at the saved offset at once: nothing is iterated,
loaded or skipped to get there. torchdata's `StatefulDataLoader` does the same for
its own loader; this one needs no extra dependency.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from air_sdk.runtime._fork_gc import forks_keep_garbage_in_the_parent

__all__ = ["ResumableLoader", "StatefulDistributedSampler", "resumable_loader"]


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    # The data-parallel rank and size come from the job's layout (dp_replicate x
    # dp_shard), never the global rank: tp, cp and pp ranks of one replica read the
    # same batch. A split given by hand must agree where disagreeing trains wrong.
    from air_sdk.runtime._layout import layout

    the_layout = layout()
    num_replicas = the_layout.dp_size if num_replicas is None else num_replicas
    rank = the_layout.dp_rank if rank is None else rank
    the_layout.check_data_split(num_replicas, rank)
    return num_replicas, rank


class StatefulDistributedSampler:
    """DistributedSampler with a position: `state_dict()` / `load_state_dict()` / `set_epoch()`.

    Each epoch, every one of `num_replicas` ranks gets its share of a permutation
    of `range(dataset_len)` drawn from `seed + epoch` (the same order as
    `torch.utils.data.DistributedSampler`). Without `drop_last` the tail is padded
    with samples from the start so every rank gets as many; with it the tail is
    dropped. With `batch_size=1` it yields indices (pass it as `sampler=`); with
    `batch_size > 1` lists of up to `batch_size` indices (pass it as `batch_sampler=`).

    The position advances as indices are handed out, which is exactly what was
    consumed with a `DataLoader` without workers; with workers the loader prefetches,
    so use `resumable_loader()`, which counts the batches it delivers instead.

    Example:
        >>> sampler = StatefulDistributedSampler(10, num_replicas=2, rank=0, shuffle=False)
        >>> it = iter(sampler); [next(it), next(it)]
        [0, 2]
        >>> sampler.state_dict()["index"]
        2
        >>> resumed = StatefulDistributedSampler(10, num_replicas=2, rank=0, shuffle=False)
        >>> resumed.load_state_dict(sampler.state_dict()); list(resumed)
        [4, 6, 8]
    """

    def __init__(
        self,
        dataset_len: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        batch_size: int = 1,
    ) -> None:
        dataset_len = operator.index(dataset_len)
        num_replicas, rank = _world(num_replicas, rank)
        if dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {dataset_len}")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, num_replicas={num_replicas})")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset_len = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.batch_size = batch_size
        self.epoch = 0
        #: samples of this rank's share of `epoch` already consumed
        self.index = 0
        self._as_batches = batch_size > 1
        self._loader_counts = False  # a ResumableLoader advances `index` as it delivers

    @property
    def num_samples(self) -> int:
        """This rank's samples per epoch."""
        if self.drop_last:
            return self.dataset_len // self.num_replicas
        return math.ceil(self.dataset_len / self.num_replicas)

    def __len__(self) -> int:
        """Items one epoch yields: samples, or batches with `batch_size > 1`."""
        if self._as_batches:
            return math.ceil(self.num_samples / self.batch_size)
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning; the current epoch again keeps the position,
        so `for epoch in range(sampler.epoch, n): sampler.set_epoch(epoch)` resumes."""
        epoch = operator.index(epoch)
        if epoch != self.epoch:
            self.epoch = epoch
            self.index = 0

    def rank_indices(self, epoch: int | None = None) -> torch.Tensor:
        """This rank's indices for `epoch` (default: the current one), in order."""
        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + epoch)
            order = torch.randperm(self.dataset_len, generator=generator)
        else:
            order = torch.arange(self.dataset_len)
        total = self.num_samples * self.num_replicas
        if total > len(order) and len(order) > 0:
            repeats = math.ceil((total - len(order)) / len(order))
            order = torch.cat([order, order.repeat(repeats)[: total - len(order)]])
        return order[:total][self.rank : total : self.num_replicas]

    def __iter__(self) -> Iterator[Any]:
        indices = self.rank_indices()
        step = self.batch_size if self._as_batches else 1
        position = self.index
        while position < len(indices):
            chunk = indices[position : position + step]
            position += len(chunk)
            if not self._loader_counts:
                self.index = position
            yield chunk.tolist() if self._as_batches else int(chunk[0])

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: plain ints and bools, the same on every rank."""
        return {
            "epoch": self.epoch,
            "index": self.index,
            "num_replicas": self.num_replicas,
            "dataset_len": self.dataset_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where `state` was taken. Another number of replicas continues at the
        same share of the epoch (approximately: each rank's samples change)."""
        for key in ("dataset_len", "seed", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"the checkpoint's sampler had {key}={state[key]!r}, this one has "
                    f"{key}={getattr(self, key)!r}: construct it with {key}={state[key]!r}"
                )
        epoch, index = int(state["epoch"]), int(state["index"])
        saved_replicas = int(state.get("num_replicas", self.num_replicas))
        if saved_replicas != self.num_replicas:
            warnings.warn(
                f"the checkpoint's sampler had {saved_replicas} replicas, this one has "
                f"{self.num_replicas}: continuing at the same share of epoch {epoch}, "
                "so some samples of this epoch repeat or are skipped",
                stacklevel=2,
            )
            index = index * saved_replicas // self.num_replicas
        self.epoch = epoch
        self.index = min(max(index, 0), self.num_samples)


class ResumableLoader:
    """A DataLoader over a StatefulDistributedSampler whose position counts delivered batches
    (not prefetched ones), so it is exact with `num_workers > 0` too. Build it with
    `resumable_loader()`; put it in the checkpoint state as it is.

    Example:
        >>> loader = resumable_loader(list(range(8)), batch_size=2, num_replicas=1, rank=0,
        ...                           shuffle=False)
        >>> it = iter(loader); next(it).tolist()
        [0, 1]
        >>> loader.state_dict()["index"]
        2
    """

    def __init__(self, loader: DataLoader[Any], sampler: StatefulDistributedSampler) -> None:
        self.loader = loader
        self.sampler = sampler
        sampler._as_batches = True
        sampler._loader_counts = True

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """See `StatefulDistributedSampler.set_epoch`."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        sampler = self.sampler
        start, end, size = sampler.index, sampler.num_samples, sampler.batch_size
        with forks_keep_garbage_in_the_parent():  # the workers fork here
            batches = iter(self.loader)
        for delivered, batch in enumerate(batches, start=1):
            sampler.index = min(start + delivered * size, end)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def resumable_loader(
    dataset: Any,
    *,
    batch_size: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    num_replicas: int | None = None,
    rank: int | None = None,
    **loader_options: Any,
) -> ResumableLoader:
    """A DataLoader that shards `dataset` across ranks and resumes exactly from a checkpoint.

    `num_replicas`/`rank` default to the layout's data-parallel size and rank
    (`air.layout().dp_size` / `.dp_rank`: dp_replicate x dp_shard, so tensor-, context-
    and pipeline-parallel ranks of one replica read the same batches); under tp, pp or
    cp > 1 other values are refused (ConfigError), as they would train wrong. Other
    keywords (`num_workers`, `collate_fn`, `pin_memory` ...) go to `DataLoader`.

    Example:
        >>> loader = resumable_loader(list(range(10)), batch_size=4, num_replicas=2, rank=1)
        >>> len(loader)
        2
    """
    for key in ("sampler", "batch_sampler", "shuffle", "drop_last"):
        if key in loader_options:
            raise TypeError(f"resumable_loader() chooses {key} itself; do not pass it")
    sampler = StatefulDistributedSampler(
        len(dataset),
        num_replicas=num_replicas,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        batch_size=batch_size,
    )
    return ResumableLoader(DataLoader(dataset, batch_sampler=sampler, **loader_options), sampler)
