"""`air.data.loader`: a DataLoader over a `ShardedDataset` that counts what the loop received.

Workers prefetch: when the loop has batch k, they may have produced k + 4. The
position saved must be what the loop consumed, so the loader counts the batches it
hands out (rank samples consumed = k * batch_size, the last batch of an epoch
short), in the training process, where the checkpoint is taken. The workers split
the rank's samples by batch (worker w makes batches w, w + W, ...), which the
DataLoader delivers in order, so the loop sees the same batches with 0, 1 or 8
workers, and the position is one integer whatever their number: a resume may use
another number of workers (and ranks).

torchdata's `StatefulDataLoader` solves the same problem by snapshotting each
worker's dataset state; its state is per worker, so a resume needs the same
number of workers. Here the position alone determines every worker's share.
"""

from __future__ import annotations

import faulthandler
import functools
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

from air_sdk.runtime._fork_gc import forks_keep_garbage_in_the_parent
from air_sdk.runtime.data._sharded import ShardedDataset
from air_sdk.runtime.data.metrics import WorkerCounts, recorder, start_worker, timed

__all__ = ["StreamLoader", "loader"]

_CHOSEN = ("shuffle", "sampler", "batch_sampler", "drop_last")


class StreamLoader:
    """Batches of a `ShardedDataset`; its `state_dict()` is the dataset's, at the batches
    the loop received. Put it in the checkpoint state as it is. Build it with `loader()`."""

    def __init__(
        self, dataset: ShardedDataset, data_loader: DataLoader[Any], batch_size: int
    ) -> None:
        self.dataset = dataset
        self.loader = data_loader
        self.batch_size = batch_size

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    @property
    def position(self) -> int:
        """Global samples of the epoch consumed, as this rank sees it."""
        return self.dataset.position

    def set_epoch(self, epoch: int) -> None:
        """See `ShardedDataset.set_epoch`."""
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches this rank has left in the epoch."""
        return math.ceil(self.dataset.samples_per_rank() / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        epoch = dataset.epoch
        start = dataset._begin()  # before the workers get their copy of the dataset
        if self.loader.num_workers > 0:
            # The workers fork when iteration starts: no prefetch thread of this process
            # may hold a lock then (a forked copy of a held lock is never released).
            dataset._store.close()
        count = dataset.samples_per_rank(start)
        # timed(): the loop's wait on each batch and the samples it got are the job's
        # data-loading metrics (samples/s, data wait; docs/data.md)
        with forks_keep_garbage_in_the_parent():  # the workers fork here
            batches = iter(self.loader)
        for delivered, batch in enumerate(timed(batches), start=1):
            dataset._consumed = min(delivered * self.batch_size, count)
            yield batch
        if dataset.epoch == epoch:  # without workers the dataset itself may have moved on
            dataset._end_epoch()

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def local_state_dict(self) -> dict[str, Any]:
        return self.dataset.local_state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dataset.load_state_dict(state)


def loader(
    dataset: ShardedDataset,
    batch_size: int,
    *,
    num_workers: int = 0,
    pin_memory: bool = False,
    **loader_options: Any,
) -> StreamLoader:
    """A DataLoader over `dataset` (this rank's share) whose position is exact with workers.

    Other keywords (`collate_fn`, `prefetch_factor`, `timeout` ...) go to `DataLoader`;
    the order is the dataset's, so `shuffle`, samplers and `drop_last` are refused, and
    `persistent_workers` too (a kept worker would not see a restored position).

    Example:
        >>> stream = loader(data, batch_size=8, num_workers=2)  # doctest: +SKIP
        >>> state = {"model": model, "data": stream}  # doctest: +SKIP
    """
    if not isinstance(dataset, ShardedDataset):
        raise TypeError(
            f"air.data.loader takes a ShardedDataset, not {type(dataset).__name__}; for a"
            " map-style dataset use air.resumable_loader"
        )
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for key in _CHOSEN:
        if key in loader_options:
            raise TypeError(
                f"air.data.loader() takes the order from the dataset; do not pass {key}"
            )
    if loader_options.get("persistent_workers"):
        raise ValueError(
            "persistent_workers=True: a kept worker would go on from its old position after a"
            " restore or set_epoch; leave it off"
        )
    dataset._batch_size = int(batch_size)
    if num_workers:
        counts = WorkerCounts(num_workers)  # their cache hits, seen by this process
        recorder().add_workers(counts)
        loader_options["worker_init_fn"] = functools.partial(
            _init_worker, counts, loader_options.get("worker_init_fn")
        )
    data_loader: DataLoader[Any] = DataLoader(
        dataset,
        batch_size=int(batch_size),
        num_workers=num_workers,
        pin_memory=pin_memory,
        **loader_options,
    )
    return StreamLoader(dataset, data_loader, int(batch_size))


def _init_worker(
    counts: WorkerCounts, user_init: Callable[[int], None] | None, worker_id: int
) -> None:
    # A worker that crashes in native code otherwise says only "Unexpected segmentation
    # fault encountered in worker": print the Python stack first (torch's own handler,
    # installed before this runs, still reports the death to the loop).
    faulthandler.enable(file=sys.__stderr__ or sys.stderr)
    start_worker(counts, worker_id)
    if user_init is not None:
        user_init(worker_id)
