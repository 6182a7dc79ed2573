"""`Checkpointer`: the guard around one job's saves and restores (see the package docstring).

The public methods own the guard (one call at a time, errors translated to
CheckpointError) and call the `_save` / `_load` hooks; the state goes through the
adapters (`_adapters`), the write through a snapshot writer (`_snapshot`), the commit
and retention through `_commit`.
"""

from __future__ import annotations

import operator
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from datetime import timedelta
from typing import Any

from air_sdk.errors import CheckpointError
from air_sdk.runtime import _failure_save
from air_sdk.runtime._context import context
from air_sdk.runtime._fork_snapshot import choose_mode, requested_mode, state_dicts
from air_sdk.runtime._manifest import Manifest, step_dir_name, verify_files
from air_sdk.runtime._poster import warn
from air_sdk.runtime._shipper import keep_alive
from air_sdk.runtime._storage import CheckpointStorage, storage_for
from air_sdk.runtime.checkpoint import _commit
from air_sdk.runtime.checkpoint._adapters import (
    ModelState,
    OptimizerState,
    data_position,
    describe_layout,
    layout,
    state_kinds,
    stateful,
)
from air_sdk.runtime.checkpoint._commit import Pending, describe, from_rank_0
from air_sdk.runtime.checkpoint._snapshot import agree_mode, snapshot_writer
from air_sdk.schema.worker_env import WorkerEnv

__all__ = ["DEFAULT_KEEP", "NO_DIST_WARNING", "Checkpointer", "instances"]

DEFAULT_KEEP = 3
_GROUP_TIMEOUT_S = 1800.0  # writing a large checkpoint to slow storage can take minutes
NO_DIST_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"

#: every Checkpointer alive, so shutdown and exit commit what each has in flight
instances: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


class Checkpointer:
    """Saves and restores one job's checkpoints under `directory` (a path or fsspec URL).

    The public methods own the guard (one call at a time, errors translated to
    CheckpointError) and call the `_save` / `_load` hooks. Keeps the newest `keep`
    committed checkpoints (default `AIR_CHECKPOINT_KEEP`, else 3).

    Example:
        >>> ckpt = Checkpointer("/tmp/ckpt-example", keep=2)
        >>> ckpt.save({"model": model}, step=10)  # doctest: +SKIP
        >>> ckpt.wait()  # doctest: +SKIP
        10
        >>> ckpt.latest()  # doctest: +SKIP
        10
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        keep: int | None = None,
        storage: CheckpointStorage | None = None,
        timeout_s: float = _GROUP_TIMEOUT_S,
        on_failure: bool | None = None,
    ) -> None:
        if keep is None:
            name = WorkerEnv.env_name("checkpoint_keep")
            raw = os.environ.get(name, "").strip()
            try:
                keep = int(raw) if raw else DEFAULT_KEEP
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
        if keep < 1:
            raise ValueError(
                f"keep must be >= 1 (the newest checkpoint is always kept), got {keep}"
            )
        if storage is None:
            location = directory if directory is not None else context().checkpoint_dir
            storage = storage_for(location) if location else None
        self.storage = storage
        self.keep = keep
        self.timeout_s = timeout_s
        if on_failure is None:
            on_failure = os.environ.get(_failure_save.ENV, "1").strip() != "0"
        #: a surviving rank checkpoints the last completed step when a peer dies
        #: (`air_sdk.runtime._failure_save`)
        self.on_failure = on_failure
        self._lock = threading.RLock()
        self._pending: Pending | None = None
        self._group: Any = None
        self._group_of: Any = None  # the default group `_group` was made under
        instances.add(self)

    @property
    def directory(self) -> str | None:
        return self.storage.root if self.storage is not None else None

    # ---- public: the guard ------------------------------------------------------------

    def save(self, state: Mapping[str, Any], step: int, *, block: bool = False) -> None:
        """Start saving `state` as checkpoint `step`; returns once it is snapshotted
        (forked, or copied to CPU; see the package docstring).

        Waits first for the previous save and raises CheckpointError if that one
        failed. `block=True` also waits until this one is committed. Every rank calls it:
        it is collective, unlike `if rank == 0: torch.save(...)`.
        """
        from air_sdk.runtime.checkpoint import register_at_exit

        started = time.monotonic()
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        storage = self._require_storage()
        with keep_alive(), self._lock:
            self._finish_pending(raise_error=True)
            self._translated(lambda: self._save(storage, state, step, started), f"save step {step}")
            register_at_exit()
            _failure_save.track(self, state, step)
            if block:
                self._finish_pending(raise_error=True)

    def load(self, state: MutableMapping[str, Any], *, step: int | None = None) -> int | None:
        """Restore the newest committed checkpoint whose files match its manifest into
        `state` and return its step; None when there is none. Every rank calls it.

        The checkpoint may come from another layout or world size (FSDP(4) into
        TP(2) x FSDP(2), or into 2 ranks): the tensors are resharded as they load, and a
        line says so. `step=N` restores exactly that one and raises CheckpointError if it
        is not intact.
        """
        if self.storage is None:
            return None
        with keep_alive(), self._lock:
            self._finish_pending(raise_error=False)
            found = self._translated(lambda: self._load(state, step), "load")
            _failure_save.track(self, state, found or 0)
            return found

    def latest(self) -> int | None:
        """The newest committed step (its manifest is in place), without hashing its files."""
        if self.storage is None:
            return None
        return _commit.latest_committed(self.storage)

    def wait(self) -> int | None:
        """Block until the save in flight is committed and return its step (None when no
        save was in flight); raises CheckpointError if it failed."""
        with keep_alive(), self._lock:
            return self._finish_pending(raise_error=True)

    def close(self) -> None:
        """Commit the save in flight (raising its error); the checkpointer stays usable."""
        self.wait()

    # ---- hooks ------------------------------------------------------------------------

    def _save(
        self, storage: CheckpointStorage, state: Mapping[str, Any], step: int, t0: float
    ) -> None:
        wrapped = stateful(state)  # a bad state fails here, before any collective
        position, parallelism, kinds = data_position(state), layout(state), state_kinds(state)
        requested = requested_mode()
        group, rank = self._process_group()
        directory = storage.join(storage.root, step_dir_name(step))
        writer = storage.writer(directory)
        # In this thread, as dcp.async_save would: lazily created optimizer state exists
        # here, and no state-dict helper of torch.distributed ever runs in a forked child.
        flat = state_dicts(wrapped)
        mode: str | None = None
        refused: str | None = None
        try:
            mode = choose_mode(requested, flat, storage, writer)
        except CheckpointError as exc:
            refused = str(exc)
        replaced: str | None = None
        problem: str | None = None
        if rank == 0:
            try:
                storage.make_dirs(storage.root)
                if storage.exists(directory):
                    replaced = _commit.move_aside(storage, directory, step)
            except OSError as exc:
                problem = f"cannot prepare {directory}: {exc}"
        # Also the barrier: no rank writes into step-N before the leftover is gone.
        problem, agreed, refused, plans = agree_mode(problem, mode, refused, flat, group)
        if problem is not None or refused is not None:
            if rank == 0 and replaced is not None:
                _commit.restore_replaced(storage, step, directory, replaced)
            raise CheckpointError(problem or refused)
        snapshot = snapshot_writer(agreed, flat, writer, group, t0, rank=rank, plans=plans)
        del flat  # the writer holds it, and lets go once the snapshot is taken
        pending = Pending(
            step=step,
            directory=directory,
            started=t0,
            snapshot=snapshot,
            data_position=position,
            replaced=replaced,
            parallelism=parallelism,
            state_kinds=kinds,
        )
        snapshot.begin()
        pending.thread = threading.Thread(
            target=_commit.commit,
            args=(pending, storage, group, rank, self.keep),
            name="air-checkpoint",
            daemon=True,
        )
        self._pending = pending
        pending.thread.start()

    def _load(self, state: MutableMapping[str, Any], wanted: int | None) -> int | None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        storage = self.storage
        assert storage is not None
        group, rank = self._process_group()
        world = dist.get_world_size(group) if group is not None else 1
        found: list[tuple[int, str, Manifest]] | str = []
        if rank == 0:
            try:
                found = _commit.committed_candidates(storage, wanted)
            except OSError as exc:
                found = f"cannot list {storage.root}: {exc}"
        found = from_rank_0(found, group)
        if isinstance(found, str):
            raise CheckpointError(found)
        chosen: tuple[int, str, Manifest] | None = None
        reasons: list[str] = []
        for step, directory, manifest in found:
            # Each rank hashes a share of the files; everyone sees every problem.
            problems = verify_files(storage, directory, list(manifest.files)[rank::world])
            if group is not None:
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, problems, group=group)
                problems = sorted(p for share in gathered for p in share)
            if not problems:
                chosen = (step, directory, manifest)
                break
            reason = f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
            reasons.append(f"step {step}: {reason}")
            if rank == 0:
                _commit.report_skip(
                    step, directory, f"file {reason}; it does not match its manifest"
                )
        if chosen is None:
            if wanted is not None:
                why = reasons[0] if reasons else "no committed checkpoint of that step"
                raise CheckpointError(f"cannot restore step {wanted}: {why}")
            return None
        step, directory, manifest = chosen
        # Checkpoints without `state_kinds` predate optimizers saved flat by parameter name.
        wrapped = stateful(state, flat_optimizers=manifest.state_kinds is not None)
        dcp.load(
            wrapped,
            storage_reader=storage.reader(directory),
            process_group=group,
            no_dist=group is None,
        )
        for key, value in wrapped.items():
            if not isinstance(value, (ModelState, OptimizerState)) and value is not state[key]:
                state[key] = value
        if rank == 0:
            how = _resharded(manifest, state, world)
            warn(f"resumed from checkpoint step {step} ({directory}){how}")
            _commit.report_restore(step, directory)
        return step

    # ---- helpers ----------------------------------------------------------------------

    def _require_storage(self) -> CheckpointStorage:
        if self.storage is None:
            raise CheckpointError(
                "no checkpoint directory: set AIR_CHECKPOINT_DIR (`air run` does) or call "
                "air.checkpoint.configure(directory=...)"
            )
        return self.storage

    def _translated(self, call: Callable[[], Any], what: str) -> Any:
        from torch.distributed.checkpoint import CheckpointException

        try:
            return call()
        except CheckpointException as exc:  # a BaseException: `except Exception` misses it
            raise CheckpointError(f"checkpoint {what} failed: {describe(exc)}") from exc

    def _process_group(self) -> tuple[Any, int]:
        """(dedicated gloo group, rank), or (None, 0) in a process without a process group.

        DCP's own background thread already issues collectives, so all checkpoint
        traffic runs on a gloo group that one thread uses at a time: the commit thread
        while a save is in flight, the training thread only once none is."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            if context().world_size > 1:
                raise CheckpointError("WORLD_SIZE > 1 but no process group: call air.init() first")
            # A world of one without a group is what we mean; DCP warns on every call (and
            # from its own thread, where catch_warnings would not reach).
            warnings.filterwarnings("ignore", message=NO_DIST_WARNING)
            return None, 0
        world_group = dist.group.WORLD
        if self._group is None or self._group_of is not world_group:
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
            self._group_of = world_group
        return self._group, dist.get_rank()

    def _finish_pending(self, *, raise_error: bool) -> int | None:
        pending = self._pending
        if pending is None:
            return None
        pending.done.wait()
        self._pending = None
        if pending.error is None:
            return pending.step
        message = f"the checkpoint of step {pending.step} was not committed: {pending.error}"
        if raise_error:
            raise CheckpointError(message)
        warn(message)
        return None


def _resharded(manifest: Manifest, state: Mapping[str, Any], world: int) -> str:
    """`; saved under X, loaded under Y (resharded)` where the layout changed, else ''."""
    now = layout(state)
    if manifest.world_size == world and (
        manifest.parallelism is None or now is None or manifest.parallelism == now
    ):
        return ""
    before = describe_layout(manifest.parallelism, manifest.world_size)
    return f"; saved under {before}, resharded to {describe_layout(now, world)}"
