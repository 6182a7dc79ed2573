"""The checkpoint records a job's event log carries (`checkpoint` events): a commit, a
checkpoint restore passed over, and the one an attempt resumed from. Re-exported by
`air_sdk.schema.events`, where the event table lists them."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from air_sdk.schema._guards import WireModel
from air_sdk.schema.numbers import NON_FINITE

__all__ = ["CheckpointCommit", "CheckpointRestore", "CheckpointSkip"]


class _Record(WireModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)


class CheckpointCommit(_Record):
    """One committed checkpoint, reported by rank 0 once its manifest is in place.

    Example:
        >>> CheckpointCommit(step=100, path="/ckpt/step-100", world_size=2, size_bytes=10,
        ...                  num_files=3, blocked_s=0.05, durable_s=1.5).step
        100
    """

    step: int = Field(ge=0)
    path: str
    world_size: int = Field(ge=1)
    size_bytes: int = Field(ge=0)
    num_files: int = Field(ge=0)
    blocked_s: float = Field(description="Seconds the training loop waited in save().")
    durable_s: float = Field(description="Seconds from save() until the manifest was in place.")
    attempt: int = 0
    snapshot: Literal["copy", "fork"] | None = Field(
        default=None, description="How save() took its snapshot (AIR_CHECKPOINT_SNAPSHOT)."
    )
    at_failure: bool = Field(
        default=False,
        description="Written by a surviving rank when a peer failed (AIR_CHECKPOINT_ON_FAILURE).",
    )
    source: str | None = Field(
        default=None,
        description="What wrote it when not air.checkpoint (air.checkpoint.record): "
        "'lightning', 'transformers', 'accelerate', ...",
    )
    committed_at: float | None = Field(
        default=None,
        # left out of the wire form when unset: a gateway from before it still takes it
        exclude_if=lambda v: v is None,
        description="Unix time of the commit: its event's ts, set when the event log is read.",
    )

    def recorded_at(self, ts: float) -> CheckpointCommit:
        """This record with its commit time: the ts of the event that carried it.

        Example:
            >>> c = CheckpointCommit(step=1, path="/c/1", world_size=1, size_bytes=0,
            ...                      num_files=0, blocked_s=0, durable_s=0)
            >>> c.recorded_at(1700000000.0).committed_at
            1700000000.0
        """
        if self.committed_at is not None:
            return self
        return self.model_copy(update={"committed_at": ts})


class CheckpointSkip(_Record):
    """A committed checkpoint that restore passed over (its files do not match its manifest).

    Example:
        >>> CheckpointSkip(step=6, path="/ckpt/step-6", skipped="__1_0.distcp: missing").step
        6
    """

    step: int = Field(ge=0)
    path: str
    skipped: str = Field(description="Why, e.g. 'file X does not match its manifest'.")
    attempt: int = 0


class CheckpointRestore(_Record):
    """The checkpoint an attempt resumed from, reported by rank 0 after a load.

    Example:
        >>> CheckpointRestore(step=40, path="/ckpt/step-40", restored=True).step
        40
    """

    step: int = Field(ge=0)
    path: str
    restored: Literal[True] = True
    attempt: int = 0
    source: str | None = Field(
        default=None, description="What wrote it when not air.checkpoint (see CheckpointCommit)."
    )
