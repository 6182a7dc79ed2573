"""Data-loading metrics of this rank: samples, time the loop waited for data, cache hits.

```python
import air_sdk.runtime as air

for batch in air.data.timed(loader):   # any iterable: a DataLoader, a generator
    loss = train_step(batch)
    air.log(step=step, loss=loss)
```

`timed` measures how long each `next()` of the loop blocked and counts the samples of
each batch; the shard store (`ShardStore.pinned`) counts cache hits and misses and
names the shard a wait is for. The counts are plain numbers under one lock (no I/O,
nothing per sample); the rank's report shipper takes their totals at most once per
`MIN_REPORT_INTERVAL_S` and sends them inside its next report
(`air_sdk.schema.data.DataLoading`). The snapshot turns them into samples/s, the share
of loop time spent waiting for data and the cache hit rate (`air status`, the monitor),
and a rank that hangs while it waits is reported as "waiting for data (shard X)".

Shards are read in a DataLoader's worker processes when there are workers: the cache
hits and misses they count reach the training process through counters in shared
memory that `air.data.loader` makes for its workers (`WorkerCounts`), one pair per
worker, so no two processes write the same number. The loop's wait is measured where
the loop runs; the shard a worker waits for stays in the worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from air_sdk.schema.data import MAX_SHARD_NAME_CHARS

__all__ = [
    "MIN_REPORT_INTERVAL_S",
    "DataRecorder",
    "Timed",
    "WorkerCounts",
    "record_cache",
    "record_samples",
    "num_samples_of",
    "record_wait",
    "recorder",
    "start_worker",
    "timed",
]

#: the totals go out with a report at most this often (a wait that starts or ends
#: within this time waits for the next report)
MIN_REPORT_INTERVAL_S = 1.0

_T = TypeVar("_T")


class DataRecorder:
    """This process's data-loading totals, and the waits going on now.

    Example:
        >>> rec = DataRecorder(clock=lambda: 10.0)
        >>> rec.record_samples(32); rec.record_cache(hit=True); rec.record_wait(0.5)
        >>> totals = rec.totals()
        >>> totals["num_samples"], totals["num_cache_hits"], totals["wait_s"]
        (32, 1, 0.5)
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.since = clock()
        self._num_samples = 0
        self._wait_s = 0.0
        self._num_hits = 0
        self._num_misses = 0
        #: thread id -> its open waits, outermost first: [shard or None, start, timed]
        self._waits: dict[int, list[tuple[str | None, float, bool]]] = {}
        #: cache counts of this process's DataLoader workers (the loaders' shared blocks)
        self._workers: list[WorkerCounts] = []
        #: in a worker: where its counts go too (the block, and its own pair in it)
        self._share: tuple[WorkerCounts, int] | None = None
        self._shipped_key: tuple[Any, ...] | None = None
        self._shipped_at = float("-inf")

    def record_wait(self, seconds: float) -> None:
        """Add time the training loop spent blocked on data."""
        if seconds < 0:
            raise ValueError(f"record_wait(): {seconds!r} is negative; pass the seconds waited")
        with self._lock:
            self._wait_s += seconds

    def record_samples(self, num: int) -> None:
        """Count `num` samples the training loop took."""
        if num < 0:
            raise ValueError(f"record_samples(): {num!r} is negative; pass a sample count")
        with self._lock:
            self._num_samples += num

    def record_cache(self, hit: bool) -> None:
        """Count one shard read from the local cache (hit) or fetched first (miss)."""
        with self._lock:
            if hit:
                self._num_hits += 1
            else:
                self._num_misses += 1
            if self._share is not None:
                counts, worker = self._share
                counts.add(worker, hit)

    def add_workers(self, counts: WorkerCounts) -> None:
        """Add the cache counts a loader's workers make to this process's totals."""
        with self._lock:
            self._workers.append(counts)

    @contextlib.contextmanager
    def waiting(self, shard: str | None = None, *, timed: bool = False) -> Iterator[None]:
        """Mark this thread as waiting for data (for `shard`, when known) while inside;
        with `timed`, the time inside is added to the loop's wait.

        Example:
            >>> rec = DataRecorder(clock=iter([0.0, 1.0, 1.5, 4.0, 5.0]).__next__)
            >>> with rec.waiting("shard-3", timed=True):
            ...     rec.totals()["waiting_shard"]
            'shard-3'
            >>> totals = rec.totals()
            >>> totals["waiting_since"] is None, totals["wait_s"]
            (True, 3.0)
        """
        key = threading.get_ident()
        entry = (shard[:MAX_SHARD_NAME_CHARS] if shard else None, self._clock(), timed)
        with self._lock:
            self._waits.setdefault(key, []).append(entry)
        try:
            yield
        finally:
            now = self._clock()
            with self._lock:
                stack = self._waits.get(key, [])
                if entry in stack:
                    stack.remove(entry)
                if not stack:
                    self._waits.pop(key, None)
                if timed and not any(t for _, _, t in stack):  # nested timed waits count once
                    self._wait_s += max(now - entry[1], 0.0)

    def totals(self, now: float | None = None) -> dict[str, Any]:
        """The totals as `air_sdk.schema.data.DataLoading` fields; `wait_s` includes a
        timed wait still going on."""
        now = self._clock() if now is None else now
        with self._lock:
            return self._totals(now)

    def take(self, force: bool = False) -> dict[str, Any] | None:
        """The totals for the next report, or None when nothing changed since the last
        ones taken or those were taken under `MIN_REPORT_INTERVAL_S` ago (`force`:
        whenever anything changed: the last report of a rank)."""
        now = self._clock()
        with self._lock:
            totals = self._totals(now)
            key = (
                self._num_samples,
                self._wait_s,
                totals["num_cache_hits"],
                totals["num_cache_misses"],
                totals["waiting_since"],
                totals["waiting_shard"],
            )
            if key == self._shipped_key:
                return None
            if not force and now - self._shipped_at < MIN_REPORT_INTERVAL_S:
                return None
            self._shipped_key, self._shipped_at = key, now
        return totals

    def _totals(self, now: float) -> dict[str, Any]:
        ongoing = 0.0
        waiting_since: float | None = None
        waiting_shard: str | None = None
        for stack in self._waits.values():
            first_timed = next((start for _, start, t in stack if t), None)
            if first_timed is not None:
                ongoing = max(ongoing, now - first_timed)
            if waiting_since is None or stack[0][1] < waiting_since:
                waiting_since = stack[0][1]
                waiting_shard = next((s for s, _, _ in reversed(stack) if s), None)
        return {
            "since": self.since,
            "ts": now,
            "num_samples": self._num_samples,
            "wait_s": self._wait_s + max(ongoing, 0.0),
            "num_cache_hits": self._num_hits + sum(c.hits() for c in self._workers),
            "num_cache_misses": self._num_misses + sum(c.misses() for c in self._workers),
            "waiting_since": waiting_since,
            "waiting_shard": waiting_shard,
        }


class WorkerCounts:
    """Cache hits and misses of a loader's `num_workers` worker processes, in shared
    memory made before they start (inherited by a fork, pickled with the worker's
    arguments by a spawn); worker w writes only its own pair.

    Example:
        >>> counts = WorkerCounts(2)
        >>> counts.add(0, hit=True); counts.add(1, hit=False); counts.add(1, hit=True)
        >>> counts.hits(), counts.misses()
        (2, 1)
    """

    def __init__(self, num_workers: int) -> None:
        self.values = multiprocessing.RawArray("q", 2 * max(int(num_workers), 1))

    def add(self, worker: int, hit: bool) -> None:
        self.values[2 * worker + (0 if hit else 1)] += 1

    def hits(self) -> int:
        return sum(self.values[0::2])

    def misses(self) -> int:
        return sum(self.values[1::2])


_recorder: DataRecorder | None = None
_recorder_lock = threading.Lock()


def recorder() -> DataRecorder:
    """This process's recorder; the first call hands its totals to the rank's report
    shipper (nothing is sent without a gateway).

    Example:
        >>> recorder() is recorder()
        True
    """
    global _recorder
    rec = _recorder
    if rec is None:
        with _recorder_lock:
            if _recorder is None:
                from air_sdk.runtime._shipper import get_shipper

                _recorder = DataRecorder()
                get_shipper().set_data_source(_recorder.take)
            rec = _recorder
    return rec


def start_worker(counts: WorkerCounts, worker: int) -> None:
    """In DataLoader worker `worker` of a loader: this process's recorder counts cache
    hits and misses into `counts` too (the training process adds them to its totals) and
    hands nothing to a report shipper: the worker is not the rank, and totals posted from
    it would replace the rank's own."""
    global _recorder
    rec = DataRecorder()
    rec._share = (counts, worker)
    with _recorder_lock:
        _recorder = rec


def _reset_after_fork() -> None:
    # A DataLoader worker: its own counts, and no lock held by a thread that is gone.
    global _recorder, _recorder_lock
    _recorder = None
    _recorder_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def record_wait(seconds: float) -> None:
    """Add `seconds` the training loop waited for data (for loaders `timed` cannot wrap).

    Example:
        >>> record_wait(0.25)
    """
    recorder().record_wait(seconds)


def record_samples(num: int) -> None:
    """Count `num` samples the training loop took (`timed` counts them itself).

    Example:
        >>> record_samples(64)
    """
    recorder().record_samples(num)


def record_cache(hit: bool) -> None:
    """Count one shard read from the local cache (`hit=True`) or fetched first.

    Example:
        >>> record_cache(hit=False)
    """
    recorder().record_cache(hit)


def num_samples_of(batch: Any) -> int:
    """How many samples a batch holds: the first dimension of a tensor or array; of the
    first element of a tuple, or of a list of tensors (DataLoader's collated `(inputs,
    targets)`); of the first value of a dict; the length of a list of plain samples;
    else 1.

    Example:
        >>> num_samples_of([[1, 2, 3], [4, 5, 6]]), num_samples_of({"x": [7, 8]}), num_samples_of(3)
        (2, 2, 1)
    """
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, dict) and batch:
        return num_samples_of(next(iter(batch.values())))
    if isinstance(batch, tuple) and batch:
        return num_samples_of(batch[0])
    if isinstance(batch, list) and batch:
        return num_samples_of(batch[0]) if hasattr(batch[0], "shape") else len(batch)
    return 1


class Timed(Generic[_T]):
    """An iterable whose `next()` waits are measured (see `timed`); everything else
    (`len`, `set_epoch`, `state_dict`, ...) is the wrapped loader's."""

    def __init__(self, iterable: Iterable[_T], samples: Callable[[_T], int] | None = None) -> None:
        self.iterable = iterable
        self._samples = samples or num_samples_of

    def __iter__(self) -> Iterator[_T]:
        rec = recorder()
        iterator = iter(self.iterable)
        while True:
            with rec.waiting(timed=True):
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            rec.record_samples(self._samples(item))
            yield item

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.iterable, name)


def timed(iterable: Iterable[_T], *, samples: Callable[[_T], int] | None = None) -> Timed[_T]:
    """`iterable` with the time the loop waits on each `next()` recorded as data wait,
    and the samples of each item counted (`samples(item)`; default: the batch's first
    dimension, see `num_samples_of`). Shown per job as samples/s and the share of step
    time spent waiting for data.

    Example:
        >>> [x for x in timed([[1, 2], [3, 4]])]
        [[1, 2], [3, 4]]
    """
    return Timed(iterable, samples)
