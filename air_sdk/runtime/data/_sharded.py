"""`ShardedDataset`: a streaming dataset over indexed shards that resumes at the exact sample.

```python
import air_sdk.runtime as air

data = air.data.ShardedDataset("/data/fineweb-bin", seq_len=1024, seed=0)
loader = air.data.loader(data, batch_size=8, num_workers=2, pin_memory=True)
state = {"model": model, "optim": optim, "data": loader}
air.checkpoint.load(state)                 # restores the position (any world size)
for epoch in range(loader.epoch, num_epochs):
    for batch in loader:                   # batch: (8, 1025) int64 tokens
        ...
        air.checkpoint.save(state, step=step)
```

The order of an epoch is one global sequence, a function of (seed, epoch) only
(`_order.GlobalOrder`). The position is one integer, the global samples of the epoch
consumed: data-parallel rank r of D (`air.layout().dp_rank` / `.dp_size`, never the
global rank) reads positions `p + r, p + r + D, ...` from the position p it started
at, and the DataLoader workers of a rank split its samples by batch (worker w makes
the rank's batches w, w + W, ...), which the DataLoader delivers in order. So after
every rank consumed k samples, the ranks together consumed exactly positions
`[p, p + k * D)` of the order, whatever D and the number of workers are, and the
checkpoint records `p + k * D` (the smallest over the ranks that read). Each rank
reads `(N - p) // D` samples of an epoch of N; the last `< D` are dropped, so all
ranks take as many steps.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from air_sdk.errors import ConfigError
from air_sdk.runtime.data._formats import ShardReader, default_decode, open_shard, samples_per_shard
from air_sdk.runtime.data._index import (
    INDEX_NAME,
    DataIndex,
    ShardEntry,
    parse_index,
    read_index,
)
from air_sdk.runtime.data._loader import _world
from air_sdk.runtime.data._order import DEFAULT_BLOCK, GlobalOrder
from air_sdk.runtime.data.cache import format_size
from air_sdk.runtime.data.storage import ShardStore

__all__ = ["DEFAULT_PREFETCH_SHARDS", "STATE_VERSION", "ShardedDataset"]

STATE_VERSION = 1
_NOT_READ = 2**62  # an agreement value above any real one: this rank did not read
_ORDER_KEYS = ("seed", "shuffle", "shuffle_block", "num_samples", "format", "seq_len")
#: remote shards downloaded ahead of the reader unless told (fewer when the cache budget
#: cannot hold them beside the shard being read)
DEFAULT_PREFETCH_SHARDS = 2
_PREFETCH_THREADS = 2  # downloads at once per process (the store's threads)


class ShardedDataset(IterableDataset[Any]):
    """Samples of the shards under `url_or_dir` (indexed by `air data index`), in the
    global order of (`seed`, epoch), this rank's share of it, from the saved position.

    `format`: tokens, jsonl or tar; default: the index's (given, it must agree).
    `seq_len`: tokens per sample for token shards (each sample is `seq_len + 1` tokens:
    inputs and shifted targets). `decode(raw) -> sample` replaces the format's default
    decoder (see `_formats`). `shuffle_block`: samples shuffled together after the
    shards are shuffled (`_order`). `dp_rank` / `dp_size` default to `air.layout()`'s.
    Remote shards: `cache_dir`, `cache_budget_bytes`, `storage_options` (`ShardStore`);
    while a shard is read, the next `prefetch_shards` of this rank's share of the order
    download in the background (default 2, fewer when the budget cannot hold them
    beside the shard read; more than it can hold is refused). With a budget, at most
    as many shards as it holds beside the prefetched ones are kept open.

    Iterate it directly or in a `DataLoader` without workers; with workers use
    `air.data.loader(...)`, which counts the batches the loop received.

    Example:
        >>> import tempfile, pathlib, numpy as np
        >>> from air_sdk.runtime.data import write_index
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> np.arange(41, dtype=np.uint16).tofile(root / "a.bin")
        >>> _ = write_index(root)
        >>> data = ShardedDataset(root, seq_len=4, shuffle=False, dp_rank=0, dp_size=1)
        >>> it = iter(data); next(it).tolist(), next(it).tolist()
        ([0, 1, 2, 3, 4], [4, 5, 6, 7, 8])
        >>> data.state_dict()["position"]
        2
    """

    def __init__(
        self,
        url_or_dir: str | os.PathLike[str],
        *,
        format: str | None = None,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_block: int = DEFAULT_BLOCK,
        decode: Callable[[Any], Any] | None = None,
        seq_len: int | None = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        max_open_shards: int = 16,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_budget_bytes: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        prefetch_shards: int | None = None,
    ) -> None:
        super().__init__()
        if int(max_open_shards) < 1:
            raise ValueError(f"max_open_shards must be >= 1, got {max_open_shards}")
        if prefetch_shards is not None and int(prefetch_shards) < 0:
            raise ValueError(f"prefetch_shards must be >= 0, got {prefetch_shards}")
        # Shards are found through a ShardStore: a local directory's files in place, a
        # remote URL's (s3://, gs://, http(s)://, memory://) downloaded into a node-local
        # cache within `cache_budget_bytes`, sha256-checked against the index.
        self._store = ShardStore(
            _store_url(url_or_dir),
            cache_dir=cache_dir,
            cache_budget_bytes=cache_budget_bytes,
            storage_options=storage_options,
            prefetch=min(
                _PREFETCH_THREADS,
                DEFAULT_PREFETCH_SHARDS if prefetch_shards is None else int(prefetch_shards),
            ),
        )
        self.root: Path | str
        if self._store.local_root is not None:
            self.root = self._store.local_root
            self.index: DataIndex = read_index(self.root)
        else:
            self.root = self._store.url
            self.index = _remote_index(self._store)
        if format is not None and format != self.index.format:
            raise ConfigError(
                f"{self.root} holds {self.index.format} shards (its index.json says so), not"
                f" {format}: drop format= or index the right directory"
            )
        self.format = self.index.format
        if self.format == "tokens":
            if seq_len is None or int(seq_len) < 1:
                raise ValueError(
                    f"token shards need seq_len >= 1 (tokens per sample), got {seq_len}"
                )
        elif seq_len is not None:
            raise ValueError(f"seq_len is for token shards; {self.root} holds {self.format}")
        if int(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if int(shuffle_block) < 1:
            raise ValueError(f"shuffle_block must be >= 1, got {shuffle_block}")
        self.seq_len = seq_len
        self.seed, self.shuffle, self.shuffle_block = int(seed), bool(shuffle), int(shuffle_block)
        self.decode = decode if decode is not None else default_decode(self.format)
        self.counts = samples_per_shard(self.index, seq_len)
        self.num_samples = sum(self.counts)
        self.dp_size, self.dp_rank = _world(dp_size, dp_rank)
        if self.num_samples < self.dp_size:
            raise ConfigError(
                f"{self.root} holds {self.num_samples} samples"
                + (f" of seq_len={seq_len}" if seq_len else "")
                + f", fewer than the {self.dp_size} data-parallel ranks: add data"
                + (" or shorten seq_len" if seq_len else "")
            )
        self.max_open_shards = max_open_shards
        self.prefetch_shards, self._open_cap = _shards_ahead(
            self._store, self.index, prefetch_shards, max_open_shards
        )
        self.epoch = 0
        self._start = 0  # the global position this rank's current pass started at
        self._consumed = 0  # samples this rank consumed since `_start`
        self._active = False  # this rank read since the last load: it takes part in the min
        self._batch_size: int | None = None  # set by air.data.loader (the workers' split)
        #: raw samples read and shards opened by this process (what a resume costs)
        self.num_reads = 0
        self.num_shard_opens = 0
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._readers: OrderedDict[int, tuple[ShardReader, ExitStack]] = OrderedDict()
        self._orders: dict[int, GlobalOrder] = {}
        self._group: Any = None

    def __getstate__(self) -> dict[str, Any]:  # what a DataLoader worker gets
        state = self.__dict__.copy()
        for key in ("_readers", "_orders", "_group"):
            del state[key]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    # ---- the order ----------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Global samples of the current epoch consumed, as this rank sees it."""
        return self._start + self.dp_size * self._consumed

    def samples_per_rank(self, start: int | None = None) -> int:
        """How many samples each rank reads from global position `start` (default: the
        current one) to the end of the epoch."""
        start = self.position if start is None else start
        return max(self.num_samples - start, 0) // self.dp_size

    def order(self, epoch: int | None = None) -> GlobalOrder:
        """The global order of `epoch` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        found = self._orders.get(epoch)
        if found is None:
            self._orders.clear()  # one epoch at a time; its block permutations are cached
            found = GlobalOrder(
                self.counts, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                block=self.shuffle_block,
            )  # fmt: skip
            self._orders[epoch] = found
        return found

    def locate(self, position: int, epoch: int | None = None) -> tuple[str, int]:
        """(shard name, sample within it) at global `position` of `epoch`.

        Example:
            >>> data.locate(0)  # doctest: +SKIP
            ('shard-00003.bin', 17)
        """
        shard, k = self.order(epoch).locate(position)
        return self.index.shards[shard].name, k

    def sample(self, position: int, epoch: int | None = None) -> Any:
        """The decoded sample at global `position` of `epoch`, read with one seek."""
        shard, k = self.order(epoch).locate(position)
        self.num_reads += 1
        return self.decode(self._reader(shard).read(k))

    def _read(self, position: int, epoch: int) -> Any:
        """`sample()` while iterating: opening a shard also starts downloading the next
        `prefetch_shards` of this rank's share of the order."""
        order = self.order(epoch)
        shard, k = order.locate(position)
        self.num_reads += 1
        if shard not in self._readers and self.prefetch_shards:
            self._close_readers_over(self._open_cap - 1)  # their room goes to the prefetch
            self._prefetch_after(order, position, shard)
        return self.decode(self._reader(shard).read(k))

    def _prefetch_after(self, order: GlobalOrder, position: int, shard: int) -> None:
        # Asked before the shard read now is pinned, so its download and theirs overlap.
        # Shards held open are cached already; a shard read after them is skipped by the
        # store when it is cached or on its way.
        held = {shard, *self._readers}
        wanted = order.shards_after(
            position, stride=self.dp_size, limit=self.prefetch_shards + len(held)
        )
        ahead = [s for s in wanted if s not in held][: self.prefetch_shards]
        if not ahead:
            return
        entries = [self.index.shards[s] for s in ahead]
        self._store.prefetch(
            [e.name for e in entries],
            checksums={e.name: e.sha256 for e in entries if e.sha256},
            sizes={e.name: e.bytes for e in entries},
        )

    # ---- shards -------------------------------------------------------------------------

    def _pinned_shard(self, entry: ShardEntry) -> AbstractContextManager[Path]:
        # The one place a shard's file is found: a local directory's own file, or a
        # remote shard downloaded and verified, never evicted while a reader holds it.
        return self._store.pinned(entry.name, sha256=entry.sha256, size=entry.bytes)

    def _reader(self, shard: int) -> ShardReader:
        found = self._readers.get(shard)
        if found is not None:
            self._readers.move_to_end(shard)
            return found[0]
        self._close_readers_over(self._open_cap - 1)  # before pinning one more: the budget
        entry = self.index.shards[shard]
        stack = ExitStack()
        path = stack.enter_context(self._pinned_shard(entry))
        table = None
        if entry.table is not None:  # where its samples start (jsonl, tar)
            table = stack.enter_context(
                self._store.pinned(entry.table, sha256=entry.table_sha256, size=entry.table_bytes)
            )
        reader = open_shard(self.index, entry, path, self.seq_len, table)
        stack.callback(reader.close)
        self.num_shard_opens += 1
        self._readers[shard] = (reader, stack)
        return reader

    def _close_readers_over(self, count: int) -> None:
        """Close the least recently used readers until `count` are open."""
        while len(self._readers) > count:
            _, (_, old) = self._readers.popitem(last=False)
            old.close()

    def close(self) -> None:
        """Close the shards this process holds open and wait for its prefetches (reading
        opens them again)."""
        self._close_readers_over(0)
        self._store.close()

    # ---- iteration ----------------------------------------------------------------------

    def _positions(self, start: int, worker: int, num_workers: int, batch: int) -> Iterator[int]:
        """The global positions this rank (and worker) reads from `start`, in order."""
        count = self.samples_per_rank(start)
        base, stride = start + self.dp_rank, self.dp_size
        if num_workers == 1:
            for j in range(count):
                yield base + stride * j
            return
        for first in range(worker * batch, count, num_workers * batch):
            for j in range(first, min(first + batch, count)):
                yield base + stride * j

    def _begin(self) -> int:
        """Start a pass at the current position: (re)base the count on it."""
        self._start, self._consumed, self._active = self.position, 0, True
        return self._start

    def _end_epoch(self) -> None:
        self.epoch, self._start, self._consumed = self.epoch + 1, 0, 0

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None:
            if self._batch_size is None:
                raise ConfigError(
                    "a ShardedDataset in a DataLoader with workers: build the loader with"
                    " air.data.loader(dataset, batch_size=..., num_workers=...), which splits"
                    " the samples among workers in batch order and counts what the loop consumed"
                )
            positions = self._positions(self.position, info.id, info.num_workers, self._batch_size)
            epoch = self.epoch
            for position in positions:
                yield self._read(position, epoch)
            return
        epoch = self.epoch
        start = self._begin()
        for j, position in enumerate(self._positions(start, 0, 1, 1)):
            sample = self._read(position, epoch)
            self._consumed = j + 1
            yield sample
        if self.epoch == epoch:
            self._end_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning; the current epoch again keeps the position, so
        `for epoch in range(data.epoch, n): data.set_epoch(epoch)` resumes."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if int(epoch) != self.epoch:
            self.epoch, self._start, self._consumed = int(epoch), 0, 0

    # ---- the position in a checkpoint ---------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position in the global order and what the order depends on.

        In a process group every rank must call it (`air.checkpoint.save` does): the
        position saved is the smallest over the ranks that read since the last load (a
        pipeline's middle stages, which read nothing, do not hold it back)."""
        return self._state(*self._agreed())

    def local_state_dict(self) -> dict[str, Any]:
        """`state_dict()` as this rank sees it, with no collective: what a survivor of a
        failed peer saves (docs/failure-handling.md). Only under pure data parallelism,
        where every rank consumed as many batches, is it everyone's."""
        return self._state(self.epoch, self.position)

    def _state(self, epoch: int, position: int) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "position": position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_block": self.shuffle_block,
            "num_samples": self.num_samples,
            "format": self.format,
            "seq_len": self.seq_len,
        }

    def _agreed(self) -> tuple[int, int]:
        epoch, position = self.epoch, self.position
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return epoch, position
        if dist.get_world_size() == 1:
            return epoch, position
        import torch

        if self._group is None:  # gloo, whatever the training backend: a CPU tensor
            self._group = dist.new_group(backend="gloo")
        stride = self.num_samples + 1
        mine = epoch * stride + position if self._active else _NOT_READ
        value = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self._group)
        agreed = int(value.item())
        if agreed == _NOT_READ:
            return epoch, position
        return divmod(agreed, stride)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at `state`'s position, on any number of ranks and workers."""
        version = state.get("version")
        if version != STATE_VERSION:
            raise ConfigError(
                f"the checkpoint's ShardedDataset state has version {version!r}; this AIR reads"
                f" version {STATE_VERSION}"
            )
        for key in _ORDER_KEYS:
            saved, mine = state.get(key), getattr(self, key)
            if saved == mine:
                continue
            if key in ("num_samples", "format"):
                fix = "read the same shards (with the same index) as the run that saved it"
            else:
                fix = f"construct it with {key}={saved!r}"
            raise ConfigError(
                f"the checkpoint's dataset had {key}={saved!r}, this one has {key}={mine!r}:"
                f" the order would differ, so the resume would not be exact; {fix}"
            )
        position = int(state["position"])
        if not 0 <= position <= self.num_samples:
            raise ConfigError(
                f"the checkpoint's position {position} is not in [0, {self.num_samples}]"
            )
        self.epoch, self._start, self._consumed = int(state["epoch"]), position, 0
        self._active = False

    def __repr__(self) -> str:
        return (
            f"ShardedDataset({str(self.root)!r}, format={self.format!r}, samples={self.num_samples},"
            f" shards={len(self.counts)}, epoch={self.epoch}, position={self.position},"
            f" dp_rank={self.dp_rank}, dp_size={self.dp_size})"
        )


def _shards_ahead(
    store: ShardStore, index: DataIndex, asked: int | None, max_open_shards: int
) -> tuple[int, int]:
    """(shards to prefetch, shards to hold open) within the cache budget, counted in
    shards of the largest size: the shards held open are pinned (never evicted), and
    each prefetched shard needs room beside them."""
    cache = store.cache
    if cache is None:  # a local directory: read in place, nothing to fetch
        return 0, max_open_shards
    ahead = DEFAULT_PREFETCH_SHARDS if asked is None else int(asked)
    budget = cache.budget_bytes
    largest = max((entry.bytes for entry in index.shards), default=0)
    if budget is None or largest == 0:
        return ahead, max_open_shards
    slots = budget // largest  # 0: the first pin refuses the shard, saying what to raise
    if asked is not None and ahead > max(slots - 1, 0):
        raise ConfigError(
            f"prefetch_shards={ahead} needs room for {ahead + 1} shards (the one read and"
            f" {ahead} ahead) of up to {format_size(largest)}; cache_budget_bytes={budget}"
            f" holds {slots}: lower prefetch_shards to {max(slots - 1, 0)} or raise"
            f" cache_budget_bytes to {(ahead + 1) * largest}"
        )
    ahead = max(min(ahead, slots - 1), 0)
    return ahead, max(min(max_open_shards, slots - ahead), 1)


def _store_url(url_or_dir: str | os.PathLike[str]) -> str:
    text = os.fspath(url_or_dir)
    if "://" not in text or text.startswith("file://"):
        root = Path(text.removeprefix("file://"))
        if not root.is_dir():
            raise ConfigError(f"{root} is not a directory of shards")
    return text


def _remote_index(store: ShardStore) -> DataIndex:
    run = f"run `air data index` on a copy of {store.url} and upload its index.json"
    try:
        raw = store.read_small(INDEX_NAME)
    except FileNotFoundError:
        raise ConfigError(f"{store.url} has no {INDEX_NAME}: {run}") from None
    return parse_index(raw, store.shard_url(INDEX_NAME), run)
