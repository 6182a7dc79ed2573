"""Commit and retention: from this rank's files written to a `manifest.json` in place.

The commit thread (`commit`) waits for the snapshot writer, hashes this rank's files,
gathers every rank's (path, size, sha256) on rank 0, which (fork) merges the ranks'
metadata into `.metadata`, written atomically and hashed, fsyncs the directory and
writes `manifest.json` last (tmp, fsync, rename, fsync), then broadcasts the outcome
and applies retention (`retain`). Every rank reaches the gather and the broadcast
whatever failed before, so the ranks never disagree about the next collective.

Example:
    >>> from air_sdk.runtime._storage import LocalStorage
    >>> is_committed(LocalStorage("/tmp/air-nothing-here"), "/tmp/air-nothing-here/step-1", 1)
    False
"""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from air_sdk.errors import CheckpointError
from air_sdk.runtime._context import context
from air_sdk.runtime._manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ManifestError,
    committed_manifest,
    list_step_dirs,
    retention_victims,
)
from air_sdk.runtime._poster import warn
from air_sdk.runtime._storage import CheckpointStorage

if TYPE_CHECKING:
    from air_sdk.runtime.checkpoint._snapshot import SnapshotWriter

__all__ = [
    "Pending",
    "commit",
    "committed_candidates",
    "describe",
    "from_rank_0",
    "is_committed",
    "latest_committed",
    "move_aside",
    "report_restore",
    "report_skip",
    "restore_replaced",
    "retain",
]

#: hidden leftovers under the root that retention removes
_LEFTOVERS = (".trash-step-", ".replaced-step-", ".failure-step-")


@dataclass
class Pending:
    """One save between `save` returning and its commit."""

    step: int
    directory: str
    started: float
    snapshot: SnapshotWriter
    data_position: dict[str, Any] | None
    replaced: str | None  # a committed copy of this step, moved aside until this one commits
    #: recorded in the manifest: the layout it was saved under, what each state key is
    parallelism: dict[str, int] | None = None
    state_kinds: dict[str, str] | None = None
    durable_s: float = 0.0
    thread: threading.Thread | None = None
    committed: Manifest | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


def from_rank_0(value: Any, group: Any) -> Any:
    """Rank 0's `value` on every rank (a collective on `group`; as it is without one)."""
    if group is None:
        return value
    import torch.distributed as dist

    shared = [value]
    dist.broadcast_object_list(shared, src=0, group=group)
    return shared[0]


def describe(exc: BaseException) -> str:
    """One line for a checkpoint failure (DCP's own exception is every rank's traceback)."""
    from torch.distributed.checkpoint import CheckpointException

    if isinstance(exc, CheckpointError):
        return str(exc)
    if isinstance(exc, CheckpointException):
        causes = {f"rank {r}: {e!r}" for r, (e, _) in sorted(exc.failures.items())}
        return "; ".join(sorted(causes)) or str(exc)
    return f"{type(exc).__name__}: {exc}"


def commit(pending: Pending, storage: CheckpointStorage, group: Any, rank: int, keep: int) -> None:
    """The commit thread: writer done -> hash own files -> gather -> rank 0 writes the
    manifest -> broadcast -> rank 0 applies retention. Sets `pending.done`."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import CheckpointException

    snapshot = pending.snapshot
    world = dist.get_world_size(group) if group is not None else 1
    mine: list[FileEntry] = []
    error: str | None = None
    part: Any = None  # this rank's part of the DCP metadata, where rank 0 merges them
    try:
        metadata = snapshot.finish()
        if not snapshot.writes_metadata:
            part = metadata
        mine = _hash_own_files(
            storage,
            pending.directory,
            metadata,
            rank,
            world,
            with_metadata=snapshot.writes_metadata,
        )
    except (Exception, CheckpointException) as exc:
        error = describe(exc)
    outcome: Manifest | str
    try:
        gathered: list[Any] = [(mine, error, part)]
        if group is not None:
            # Only rank 0 needs them (partial metadata grows with the model).
            gathered = [None] * world if rank == 0 else None  # type: ignore[assignment]
            dist.gather_object((mine, error, part), gathered, dst=0, group=group)
        outcome = "rank 0 did not answer"
        if rank == 0:
            try:
                outcome = _write_manifest(storage, pending, gathered, world)
            except OSError as exc:
                outcome = f"writing {MANIFEST_NAME} failed: {exc}"
        outcome = from_rank_0(outcome, group)
    except (Exception, CheckpointException) as exc:
        outcome = f"the ranks could not agree on the commit: {describe(exc)}"
    if isinstance(outcome, Manifest):
        pending.committed = outcome
        if rank == 0:
            _report_commit(pending, outcome)
            retain(storage, pending.step, keep)
    else:
        pending.error = outcome
        if rank == 0 and pending.replaced is not None:
            restore_replaced(storage, pending.step, pending.directory, pending.replaced)
    pending.done.set()


def _hash_own_files(
    storage: CheckpointStorage,
    directory: str,
    metadata: Any,
    rank: int,
    world: int,
    *,
    with_metadata: bool = True,
) -> list[FileEntry]:
    """This rank's share of the files DCP wrote: its own `__<rank>_*` files (still in
    the page cache), and on rank 0 `.metadata` (unless rank 0 has yet to write it,
    in fork mode) and anything not named after a rank."""
    paths = {info.relative_path for info in metadata.storage_data.values()}
    if with_metadata:
        paths.add(".metadata")
    prefixes = {r: f"__{r}_" for r in range(world)}
    entries = []
    for path in sorted(paths):
        owner = next((r for r, p in prefixes.items() if path.startswith(p)), 0)
        if owner == rank:
            size, sha = storage.digest(storage.join(directory, path))
            entries.append(FileEntry(path=path, size=size, sha256=sha))
    return entries


def _write_manifest(
    storage: CheckpointStorage, pending: Pending, gathered: list[Any], world: int
) -> Manifest | str:
    errors = [f"rank {r}: {err}" for r, (_, err, _) in enumerate(gathered) if err]
    if errors:
        return "; ".join(errors)
    ctx = context()
    files = [e for entries, _, _ in gathered for e in entries]
    try:
        merged = pending.snapshot.merged_metadata([part for _, _, part in gathered])
    except ValueError as exc:
        return f"the ranks' checkpoint metadata do not fit together: {exc}"
    if merged is not None:  # the ranks' parts of the metadata make one .metadata
        path = storage.join(pending.directory, ".metadata")
        storage.write_atomic(path, pickle.dumps(merged))
        size, sha = storage.digest(path)
        files.append(FileEntry(path=".metadata", size=size, sha256=sha))
    files.sort(key=lambda e: e.path)
    manifest = Manifest(
        step=pending.step,
        world_size=world,
        files=tuple(files),
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        data_position=pending.data_position,
        parallelism=pending.parallelism,
        state_kinds=pending.state_kinds,
    )
    storage.sync_dir(pending.directory)  # every data file's directory entry first
    storage.write_atomic(storage.join(pending.directory, MANIFEST_NAME), manifest.to_json())
    storage.sync_dir(storage.root)
    pending.durable_s = time.monotonic() - pending.started
    return manifest


def _report_commit(pending: Pending, manifest: Manifest) -> None:
    from air_sdk.runtime._shipper import get_shipper

    get_shipper().add_checkpoint(
        manifest.commit_record(
            pending.directory,
            pending.snapshot.blocked_s,
            pending.durable_s,
            snapshot=pending.snapshot.name,
        )
    )


def report_restore(step: int, directory: str) -> None:
    """Tell the gateway which checkpoint this attempt resumed from."""
    from air_sdk.runtime._shipper import get_shipper

    get_shipper().add_checkpoint(
        {"step": step, "path": directory, "restored": True, "attempt": context().attempt}
    )


def report_skip(step: int, directory: str, reason: str) -> None:
    """Say (here and to the gateway) that restore passed over a committed checkpoint."""
    from air_sdk.runtime._shipper import get_shipper

    warn(f"skipped checkpoint step {step}: {reason}")
    get_shipper().add_checkpoint(
        {"step": step, "path": directory, "skipped": reason, "attempt": context().attempt}
    )


def is_committed(storage: CheckpointStorage, directory: str, step: int) -> bool:
    """Whether `directory` holds a valid manifest of `step` (its files are not hashed)."""
    try:
        return committed_manifest(storage, directory, step) is not None
    except (ManifestError, OSError):
        return False


def move_aside(storage: CheckpointStorage, directory: str, step: int) -> str | None:
    """Move a leftover `step-N` away; return its new path if it was a committed one."""
    committed = is_committed(storage, directory, step)
    kind = "replaced" if committed else "trash"
    aside = storage.join(storage.root, f".{kind}-step-{step}-{uuid.uuid4().hex[:8]}")
    storage.move(directory, aside)
    return aside if committed else None


def restore_replaced(storage: CheckpointStorage, step: int, directory: str, replaced: str) -> None:
    """Put the committed copy of `step` that a failed save replaced back in place."""
    try:
        failed = storage.join(storage.root, f".trash-step-{step}-{uuid.uuid4().hex[:8]}")
        if storage.exists(directory):
            storage.move(directory, failed)
        storage.move(replaced, directory)
    except OSError as exc:
        warn(f"could not put the earlier checkpoint of step {step} back: {exc}")


def retain(storage: CheckpointStorage, committed_step: int, keep: int) -> None:
    """Rank 0, after a commit: apply `retention_victims`, then drop what was moved aside."""
    try:
        dirs = dict(list_step_dirs(storage))
        steps = [(step, is_committed(storage, path, step)) for step, path in dirs.items()]
        for step in retention_victims(steps, keep=keep, just_committed=committed_step):
            # Uncommit first: a half-deleted directory must never look restorable.
            storage.remove_file(storage.join(dirs[step], MANIFEST_NAME))
            storage.remove_tree(dirs[step])
        for name in storage.list_dir(storage.root):
            if name.startswith(_LEFTOVERS):
                storage.remove_tree(storage.join(storage.root, name))
    except OSError as exc:
        warn(f"checkpoint retention failed ({exc}); old checkpoints were left in place")


def committed_candidates(
    storage: CheckpointStorage, wanted: int | None
) -> list[tuple[int, str, Manifest]]:
    """Rank 0: committed checkpoints, newest first (an invalid manifest is reported)."""
    out = []
    for step, directory in list_step_dirs(storage):
        if wanted is not None and step != wanted:
            continue
        try:
            manifest = committed_manifest(storage, directory, step)
        except (ManifestError, OSError) as exc:
            report_skip(step, directory, f"{MANIFEST_NAME} is not valid ({exc})")
            continue
        if manifest is not None:  # no manifest: never committed, does not exist
            out.append((step, directory, manifest))
    return out


def latest_committed(storage: CheckpointStorage) -> int | None:
    """The newest committed step, without hashing its files."""
    for step, directory in list_step_dirs(storage):
        if is_committed(storage, directory, step):
            return step
    return None
