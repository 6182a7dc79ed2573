"""Snapshot writers: how `save` takes its snapshot and writes this rank's part.

Two variants behind one interface (`SnapshotWriter`), picked per save by
`AIR_CHECKPOINT_SNAPSHOT` and agreed by every rank (`agree_mode`):

* `CopySnapshot`: `dcp.async_save` copies the state into CPU memory in the training
  thread, then writes it; DCP writes `.metadata` itself.
* `ForkSnapshot`: the training thread forks a copy-on-write child that writes this
  rank's share (`air_sdk.runtime._fork_snapshot`) and goes on; the commit thread waits
  for the child. Each rank hands its part of DCP's metadata to rank 0, which merges them.

The checkpointer calls `begin()` in the training thread, which returns once the state
may change, then starts the commit thread, which calls `finish()`.

Example:
    >>> CopySnapshot.name, ForkSnapshot.name, ForkSnapshot.writes_metadata
    ('copy', 'fork', False)
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from air_sdk.errors import CheckpointError
from air_sdk.runtime._fork_snapshot import ForkedWrite, local_plan, merge_metadata, my_share

if TYPE_CHECKING:
    from concurrent.futures import Future

    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["CopySnapshot", "ForkSnapshot", "SnapshotWriter", "agree_mode", "snapshot_writer"]


class SnapshotWriter(ABC):
    """One rank's write of one checkpoint, from the snapshot to its files on storage.

    `state` is the flat state dict (every stateful entry's `state_dict()` already
    taken), `writer` the DCP StorageWriter of the checkpoint directory, `started` the
    monotonic time `save` was called.
    """

    #: the mode's name (`AIR_CHECKPOINT_SNAPSHOT`, the commit event's `snapshot`)
    name: ClassVar[str]
    #: whether DCP writes `.metadata` itself; else rank 0 merges the ranks' parts
    writes_metadata: ClassVar[bool]

    def __init__(self, state: dict[str, Any], writer: Any, group: Any, started: float) -> None:
        self.state = state
        self.writer = writer
        self.group = group
        self.started = started
        #: seconds the training thread was held (set once the snapshot is taken)
        self.blocked_s = 0.0

    def begin(self) -> None:  # noqa: B027 - a hook a variant may leave empty
        """Training thread, before the commit thread starts: returns once the state may
        change again."""

    @abstractmethod
    def finish(self) -> Metadata:
        """Commit thread: wait until this rank's files are written; the DCP metadata
        (all of it, or this rank's part where `writes_metadata` is False)."""

    def merged_metadata(self, parts: list[Metadata]) -> Metadata | None:
        """Rank 0: the `.metadata` to write from every rank's part (None: DCP wrote it).
        ValueError where the parts do not fit together."""
        return None


class CopySnapshot(SnapshotWriter):
    """`dcp.async_save`: the state is copied to CPU memory before `save` returns."""

    name = "copy"
    writes_metadata = True

    def __init__(self, state: dict[str, Any], writer: Any, group: Any, started: float) -> None:
        super().__init__(state, writer, group, started)
        self._future: Future[Any] | None = None

    def begin(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        response = dcp.async_save(
            self.state,
            storage_writer=self.writer,
            process_group=self.group,
            no_dist=self.group is None,
        )
        # A stager of its own would hand back an AsyncSaveResponse; ours (the writer) does not.
        if isinstance(response, AsyncSaveResponse):
            response = response.upload_completion
        self._future = response
        self.state = {}  # DCP holds its copy
        self.blocked_s = time.monotonic() - self.started

    def finish(self) -> Metadata:
        assert self._future is not None, "begin() first"
        metadata: Metadata = self._future.result()
        return metadata


class ForkSnapshot(SnapshotWriter):
    """A copy-on-write child writes this rank's `share` of the items (None: all of them,
    a world of one). The training thread forks it, in `begin()` (why that thread:
    `ForkedWrite.start`); the commit thread only waits for the child."""

    name = "fork"
    writes_metadata = False

    def __init__(
        self,
        state: dict[str, Any],
        writer: Any,
        group: Any,
        started: float,
        *,
        rank: int,
        share: set[Any] | None,
    ) -> None:
        super().__init__(state, writer, group, started)
        self.forked = ForkedWrite(state, writer, rank, share)
        self.state = {}  # the child gets its copy through `forked`
        self._not_forked: CheckpointError | None = None

    def begin(self) -> None:
        try:
            self.forked.start()
        except Exception as exc:  # the commit thread reports it, as every rank's outcome
            self._not_forked = CheckpointError(f"cannot fork the checkpoint writer: {exc}")
        finally:
            self.blocked_s = time.monotonic() - self.started

    def finish(self) -> Metadata:
        if self._not_forked is not None:
            raise self._not_forked
        return self.forked.wait()

    def merged_metadata(self, parts: list[Metadata]) -> Metadata:
        return merge_metadata(parts)


def agree_mode(
    problem: str | None, mode: str | None, refused: str | None, state: dict[str, Any], group: Any
) -> tuple[str | None, str, str | None, list[Any] | None]:
    """(rank 0's problem, the mode every rank uses, the ranks' refusals, every rank's
    save plan where they fork): a collective on `group` (as it is without one). Fork
    only where every rank can: their collectives differ. Also the save's barrier."""
    import torch.distributed as dist

    if group is None:
        return problem, mode or "copy", refused, None
    plan = local_plan(state, dist.get_rank()) if mode == "fork" else None
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (problem, mode, refused, plan), group=group)
    refusals = [f"rank {r}: {why}" for r, (_, _, why, _) in enumerate(gathered) if why]
    modes = {m for _, m, _, _ in gathered if m}
    agreed = "fork" if modes == {"fork"} else "copy"
    plans = [p for _, _, _, p in gathered] if agreed == "fork" else None
    return gathered[0][0], agreed, "; ".join(refusals) or None, plans


def snapshot_writer(
    mode: str,
    state: dict[str, Any],
    writer: Any,
    group: Any,
    started: float,
    *,
    rank: int,
    plans: list[Any] | None,
) -> SnapshotWriter:
    """The writer of the agreed `mode` for this rank.

    Example:
        >>> w = snapshot_writer("copy", {}, None, None, 0.0, rank=0, plans=None)
        >>> type(w).__name__
        'CopySnapshot'
    """
    if mode == "fork":
        share = my_share(plans, rank) if plans is not None else None
        return ForkSnapshot(state, writer, group, started, rank=rank, share=share)
    return CopySnapshot(state, writer, group, started)
