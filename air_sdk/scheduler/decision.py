"""What one scheduling cycle decides: `Decision`, with its `Preemption`s and
`Reservation`s. Plain frozen data, made by `air_sdk.scheduler.decide`.

Example:
    >>> Reservation(job_id="big", pool="a100", start_at=None, nodes=("n0", "n1")).start_at is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from air_sdk.schema import Placement

__all__ = ["Decision", "Preemption", "Reservation"]


@dataclass(frozen=True)
class Preemption:
    """Stop `victim_job_id` (SIGTERM, grace to checkpoint, then requeue) so that
    `for_job_id` can start."""

    victim_job_id: str
    for_job_id: str
    reason: str


@dataclass(frozen=True)
class Reservation:
    """Where and when a partition's blocked head job is expected to start.

    `start_at` is None when it cannot be told: running jobs without an expected end,
    or preempted jobs still exiting."""

    job_id: str
    pool: str
    start_at: float | None
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    """The outcome of one cycle.

    `positions` counts from 1 per pool (1: next to start there); `routes` is the pool
    each waiting job was routed to this cycle; `reservations` is keyed by pool (or
    "pool/accelerator" for a pool of mixed accelerators).
    """

    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    #: {job_id: why it waits}; a Mapping whose sentences are made when read
    explanations: Mapping[str, str] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    routes: dict[str, str] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)
