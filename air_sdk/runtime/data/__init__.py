"""Data for training code: exact resume of a map-style dataset (`resumable_loader`).

`storage`/`cache`: `ShardStore`, shards from a directory or any fsspec URL behind a
local LRU cache with a byte budget. `metrics`: `timed(loader)` and `record_*`, the
data-loading numbers a job's snapshot, monitor and hang reports show (docs/data.md).

`_loader`: a stateful distributed sampler over a dataset the user holds; its position
goes into `air.checkpoint` and a resume starts there at once. The split comes from
`air.layout()` (data-parallel rank and size), never the global rank.
"""

from air_sdk.runtime.data._loader import (
    ResumableLoader,
    StatefulDistributedSampler,
    resumable_loader,
)
from air_sdk.runtime.data.metrics import record_cache, record_samples, record_wait, timed
from air_sdk.runtime.data.storage import ShardStore

__all__ = [
    "ResumableLoader",
    "ShardStore",
    "StatefulDistributedSampler",
    "record_cache",
    "record_samples",
    "record_wait",
    "resumable_loader",
    "timed",
]
