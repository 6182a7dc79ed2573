"""Data for training code: exact resume of a map-style dataset (`resumable_loader`).

`_loader`: a stateful distributed sampler over a dataset the user holds; its position
goes into `air.checkpoint` and a resume starts there at once. The split comes from
`air.layout()` (data-parallel rank and size), never the global rank.
"""

from air_sdk.runtime.data._loader import (
    ResumableLoader,
    StatefulDistributedSampler,
    resumable_loader,
)

__all__ = ["ResumableLoader", "StatefulDistributedSampler", "resumable_loader"]
