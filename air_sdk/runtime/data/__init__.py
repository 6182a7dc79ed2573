"""Data for training code (`air.data`): streaming sharded datasets and exact resume.

* `ShardedDataset(dir, seq_len=..., seed=...)` (`_sharded`): token (`.bin`/`.npy`),
  JSONL or WebDataset-tar shards indexed once by `air data index DIR` (`_index`), read
  in a global order that is a function of (seed, epoch) only (`_order`), split by
  `air.layout()`'s data-parallel rank; `loader(dataset, batch_size, num_workers=...)`
  (`_stream_loader`) counts the batches the loop received, so the position saved in
  `air.checkpoint` is exact with workers and resumes on any number of ranks.
* `resumable_loader(dataset, ...)` (`_loader`): a stateful distributed sampler over a
  map-style dataset the user holds.
* `ShardStore` (`storage`, `cache`): shards from a directory or any fsspec URL behind a
  node-local LRU cache with a byte budget, checksums verified while streaming.
* `timed(loader)` and `record_*` (`metrics`): the data-loading numbers a job's
  snapshot, monitor and hang reports show (docs/data.md).

Importing this package imports neither torch nor numpy (the `air` CLI writes indexes
through `_index`); each name is loaded on first use.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = [
    "DataIndex",
    "ResumableLoader",
    "ShardStore",
    "ShardedDataset",
    "StatefulDistributedSampler",
    "StreamLoader",
    "loader",
    "position_holders",
    "read_index",
    "record_cache",
    "record_samples",
    "record_wait",
    "resumable_loader",
    "timed",
    "write_index",
]

_HOMES = {
    "DataIndex": "_index",
    "ResumableLoader": "_loader",
    "ShardedDataset": "_sharded",
    "StatefulDistributedSampler": "_loader",
    "StreamLoader": "_stream_loader",
    "loader": "_stream_loader",
    "read_index": "_index",
    "resumable_loader": "_loader",
    "write_index": "_index",
    "ShardStore": "storage",
    "timed": "metrics",
    "record_cache": "metrics",
    "record_samples": "metrics",
    "record_wait": "metrics",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'air_sdk.runtime.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def position_holders() -> tuple[type, ...]:
    """The classes loaded so far whose `state_dict()` is a data position (what the
    checkpoint manifest records as `data_position`); nothing is imported to answer."""
    found: list[type] = []
    for home, names in (
        ("_loader", ("StatefulDistributedSampler", "ResumableLoader")),
        ("_sharded", ("ShardedDataset",)),
        ("_stream_loader", ("StreamLoader",)),
    ):
        module = sys.modules.get(f"{__name__}.{home}")
        if module is not None:
            found.extend(getattr(module, name) for name in names)
    return tuple(found)
