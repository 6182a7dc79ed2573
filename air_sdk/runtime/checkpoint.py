"""Checkpoints that survive crashes: `air.checkpoint.save(state, step=...)` and
`step = air.checkpoint.load(state)`.

```python
import air_sdk.runtime as air

air.init()
state = {"model": model, "optim": optim, "data": loader, "epoch": 0}
start = air.checkpoint.load(state)        # None: nothing to resume; else the step, state restored
for step in range((start or 0) + 1, num_steps + 1):
    train_step()
    if step % 100 == 0:
        air.checkpoint.save(state, step=step)  # blocks only while the state is snapshotted
air.shutdown()                            # commits the save still in flight
```

`state` maps names to modules (plain, DDP, FSDP2), optimizers, anything with
`state_dict()`/`load_state_dict()` (LR schedulers, `air.resumable_loader`), and
small plain values (numbers, strings, dicts and lists of them), which `load`
writes back into the dict. An optimizer is saved with the module in `state` that
holds its parameters, through `torch.distributed.checkpoint.state_dict`, so keys
are parameter names and DDP's `module.` prefix does not matter. Every rank passes
the same keys, and `load` needs the keys the checkpoint was saved with. A plain
value is saved once (from one rank): keep a value that differs between ranks
under a per-rank key. Saving before the first optimizer step creates the
optimizer's state (as `get_optimizer_state_dict` does), e.g. Adam's step count.

Snapshot. `save` returns once it holds a snapshot of the state, taken one of two
ways (`AIR_CHECKPOINT_SNAPSHOT`, default `copy`):

* `fork`: the training thread builds the state dict (the `state_dict()` of the
  wrappers above, so lazily created optimizer state exists in this process), the
  ranks agree on who writes which replicated tensor (DCP's dedup), and the commit
  thread forks. The child writes this rank's part of the standard DCP layout
  (`__<rank>_*.distcp`) from its copy-on-write view of memory, with no collective,
  hands its part of DCP's metadata back, and always leaves with `os._exit`; it dies
  with the forking thread (PR_SET_PDEATHSIG). The save blocks for the state dict and
  the fork, not for a copy; the copy is paid later, page by page, by the parent's
  first write to each page while the child is alive (the next optimizer step), and
  memory grows by up to one copy of the state until the child exits. See
  `air_sdk.runtime._fork_snapshot`.
* `copy`: `dcp.async_save` copies the state into CPU memory, then writes it.

`auto` forks on Linux (not macOS) when every tensor of the state is on the CPU and
the storage is a local directory (LocalStorage, or fsspec `file://`); else it copies.
`fork` forces the fork and raises CheckpointError where it is unsafe (a CUDA tensor:
forking a CUDA process is undefined; an in-memory store the child cannot share).
Every rank uses the same mode: fork only if all can.

Commit protocol. Each save writes `<dir>/step-<step>` (a leftover there is moved
aside first, never written over). A commit thread waits for the writer (DCP's
future, or the forked child: reaped with waitpid, its exit status or signal is the
save's error), hashes this rank's files, gathers every rank's (path, size, sha256)
on rank 0, which (fork) merges the ranks' metadata into `.metadata`, written
atomically and hashed, fsyncs the directory and writes `manifest.json` last (tmp,
fsync, rename, fsync), then broadcasts the outcome and applies retention. A
directory without a valid manifest does not exist for restore. DCP's own background
thread already issues collectives, so all checkpoint traffic runs on a dedicated
gloo group that only one thread uses at a time: the commit thread while a save is in
flight, the training thread (save's barrier, load) only once no save is. Training
collectives stay on the default group. Committing in the background, rather than at
the next save, makes a checkpoint restorable seconds after it was taken, not one
interval later.
"""

from __future__ import annotations

import atexit
import operator
import os
import pickle
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from air_sdk.errors import CheckpointError
from air_sdk.runtime import _failure_save
from air_sdk.runtime._context import context
from air_sdk.runtime._fork_snapshot import (
    ForkedWrite,
    choose_mode,
    local_plan,
    merge_metadata,
    my_share,
    requested_mode,
    state_dicts,
)
from air_sdk.runtime._manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ManifestError,
    committed_manifest,
    list_step_dirs,
    retention_victims,
    step_dir_name,
    verify_files,
)
from air_sdk.runtime._poster import warn
from air_sdk.runtime._shipper import keep_alive
from air_sdk.runtime._storage import CheckpointStorage, storage_for
from air_sdk.schema.worker_env import WorkerEnv

if TYPE_CHECKING:
    from concurrent.futures import Future

    import torch

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "close",
    "configure",
    "latest",
    "load",
    "save",
    "wait",
]

DEFAULT_KEEP = 3
_GROUP_TIMEOUT_S = 1800.0  # writing a large checkpoint to slow storage can take minutes
_NO_DIST_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"


@dataclass
class _Pending:
    """One save between `save` returning and its commit."""

    step: int
    directory: str
    started: float
    blocked_s: float
    future: Future[Any] | None  # copy: DCP's async_save
    data_position: dict[str, Any] | None
    replaced: str | None  # a committed copy of this step, moved aside until this one commits
    forked: ForkedWrite | None = None  # fork: the child writing this rank's part
    fork_error: BaseException | None = None
    launched: threading.Event = field(default_factory=threading.Event)
    durable_s: float = 0.0
    thread: threading.Thread | None = None
    committed: Manifest | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _ModelState:
    """A module through `get_model_state_dict`: parameter names without wrapper prefixes,
    FSDP2 shards as DTensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state)


class _OptimizerState:
    """An optimizer keyed by parameter names; its lazily created state is made first,
    so loading into a fresh optimizer works."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state)


def _stateful(state: Mapping[str, Any]) -> dict[str, Any]:
    """What DCP sees: modules and optimizers wrapped, everything else as it is."""
    import torch

    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise TypeError("the checkpoint state must be a dict with string keys")
    modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            out[key] = _ModelState(value)
        elif isinstance(value, torch.optim.Optimizer):
            out[key] = _OptimizerState(_owner(key, value, modules), value)
        else:
            out[key] = value
    return out


def _owner(
    key: str, optimizer: torch.optim.Optimizer, modules: Mapping[str, torch.nn.Module]
) -> torch.nn.Module:
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules.values():
        if wanted <= {id(p) for p in module.parameters()}:
            return module
    raise CheckpointError(
        f"state[{key!r}] optimizes parameters that no module in the state holds: "
        "put the model in the state too, e.g. state['model'] = model"
    )


def _data_position(state: Mapping[str, Any]) -> dict[str, Any] | None:
    data = sys.modules.get("air_sdk.runtime.data")
    if data is None:  # nothing can hold a data position without that module
        return None
    kinds = (data.StatefulDistributedSampler, data.ResumableLoader)
    found = {k: v.state_dict() for k, v in state.items() if isinstance(v, kinds)}
    return found or None


def _from_rank_0(value: Any, group: Any) -> Any:
    """Rank 0's `value` on every rank (a collective on `group`; as it is without one)."""
    if group is None:
        return value
    import torch.distributed as dist

    shared = [value]
    dist.broadcast_object_list(shared, src=0, group=group)
    return shared[0]


def _agree(
    problem: str | None, mode: str | None, refused: str | None, plan: Any, group: Any
) -> tuple[str | None, str | None, str | None, list[Any] | None]:
    """(rank 0's problem, the mode every rank uses, the ranks' refusals, every rank's
    save plan where they fork): a collective on `group`, as it is without one. Fork
    only where every rank can."""
    if group is None:
        return problem, mode, refused, None
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (problem, mode, refused, plan), group=group)
    refusals = [f"rank {r}: {why}" for r, (_, _, why, _) in enumerate(gathered) if why]
    modes = {m for _, m, _, _ in gathered if m}
    agreed = "fork" if modes == {"fork"} else "copy"
    plans = [p for _, _, _, p in gathered] if agreed == "fork" else None
    return gathered[0][0], agreed, "; ".join(refusals) or None, plans


def _describe(exc: BaseException) -> str:
    from torch.distributed.checkpoint import CheckpointException

    if isinstance(exc, CheckpointError):
        return str(exc)
    if isinstance(exc, CheckpointException):
        # Its str() is every rank's traceback; the last line per rank says what went wrong.
        causes = {f"rank {r}: {e!r}" for r, (e, _) in sorted(exc.failures.items())}
        return "; ".join(sorted(causes)) or str(exc)
    return f"{type(exc).__name__}: {exc}"


class Checkpointer:
    """Saves and restores one job's checkpoints under `directory` (a path or fsspec URL).

    The public methods own the guard (one call at a time, errors translated to
    CheckpointError) and call the `_save` / `_load` / `_commit` hooks. Keeps the
    newest `keep` committed checkpoints (default `AIR_CHECKPOINT_KEEP`, else 3).

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
        self._pending: _Pending | None = None
        self._group: Any = None
        self._group_of: Any = None  # the default group `_group` was made under
        _instances.add(self)

    @property
    def directory(self) -> str | None:
        return self.storage.root if self.storage is not None else None

    # ---- public: the guard ------------------------------------------------------------

    def save(self, state: Mapping[str, Any], step: int, *, block: bool = False) -> None:
        """Start saving `state` as checkpoint `step`; returns once it is snapshotted
        (forked, or copied to CPU; see the module docstring).

        Waits first for the previous save and raises CheckpointError if that one
        failed. `block=True` also waits until this one is committed. Every rank calls it:
        it is collective, unlike `if rank == 0: torch.save(...)`.
        """
        started = time.monotonic()
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        storage = self._require_storage()
        with keep_alive(), self._lock:
            self._finish_pending(raise_error=True)
            self._translated(lambda: self._save(storage, state, step, started), f"save step {step}")
            _register_at_exit()
            _failure_save.track(self, state, step)
            if block:
                self._finish_pending(raise_error=True)

    def load(self, state: MutableMapping[str, Any], *, step: int | None = None) -> int | None:
        """Restore the newest committed checkpoint whose files match its manifest into
        `state` and return its step; None when there is none. Every rank calls it.

        `step=N` restores exactly that one and raises CheckpointError if it is not intact.
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
        for step, directory in list_step_dirs(self.storage):
            if _is_committed(self.storage, directory, step):
                return step
        return None

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
        stateful = _stateful(state)  # a bad state fails here, before any collective
        data_position = _data_position(state)
        requested = requested_mode()
        group, rank = self._process_group()
        directory = storage.join(storage.root, step_dir_name(step))
        writer = storage.writer(directory)
        # In this thread, as dcp.async_save would: lazily created optimizer state exists
        # here, and no state-dict helper of torch.distributed ever runs in a forked child.
        flat = state_dicts(stateful)
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
                    replaced = self._move_aside(storage, directory, step)
            except OSError as exc:
                problem = f"cannot prepare {directory}: {exc}"
        # Also the barrier: no rank writes into step-N before the leftover is gone. Every
        # rank takes the same snapshot mode (their collectives differ): fork only if all can.
        plan = local_plan(flat, rank) if mode == "fork" and group is not None else None
        problem, mode, refused, plans = _agree(problem, mode, refused, plan, group)
        if problem is not None or refused is not None:
            if rank == 0 and replaced is not None:
                self._restore_replaced(
                    storage, _Pending(step, directory, t0, 0.0, None, None, replaced)
                )
            raise CheckpointError(problem or refused)
        pending = _Pending(
            step=step,
            directory=directory,
            started=t0,
            blocked_s=0.0,
            future=None,
            data_position=data_position,
            replaced=replaced,
        )
        if mode == "fork":
            share = my_share(plans, rank) if plans is not None else None
            pending.forked = ForkedWrite(flat, writer, rank, share)
        else:
            pending.future = self._async_save(flat, writer, group)
            pending.blocked_s = time.monotonic() - t0
        pending.thread = threading.Thread(
            target=self._commit, args=(pending, group, rank), name="air-checkpoint", daemon=True
        )
        self._pending = pending
        pending.thread.start()
        if pending.forked is not None:
            pending.launched.wait()  # the commit thread forks; the state is ours again after

    @staticmethod
    def _async_save(flat: dict[str, Any], writer: Any, group: Any) -> Future[Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        response = dcp.async_save(
            flat, storage_writer=writer, process_group=group, no_dist=group is None
        )
        # A stager of its own would hand back an AsyncSaveResponse; ours (the writer) does not.
        if isinstance(response, AsyncSaveResponse):
            return response.upload_completion
        return response

    def _launch(self, pending: _Pending) -> None:
        """The commit thread forks the writer: the child's death signal is tied to the
        forking thread, and this one lives until the child is reaped."""
        assert pending.forked is not None
        try:
            pending.forked.start()
        except BaseException as exc:
            pending.fork_error = exc
        finally:
            pending.blocked_s = time.monotonic() - pending.started
            pending.launched.set()

    def _commit(self, pending: _Pending, group: Any, rank: int) -> None:
        """The commit thread: DCP done -> hash own files -> gather -> rank 0 writes the manifest.

        Every rank reaches the gather and the broadcast whatever failed before, so the
        ranks never disagree about which collective comes next on the group."""
        import torch.distributed as dist
        from torch.distributed.checkpoint import CheckpointException

        storage = self.storage
        assert storage is not None
        world = dist.get_world_size(group) if group is not None else 1
        mine: list[FileEntry] = []
        error: str | None = None
        partial: Any = None  # fork: this rank's part of the DCP metadata
        try:
            if pending.forked is not None:
                self._launch(pending)
                if pending.fork_error is not None:
                    raise CheckpointError(
                        f"cannot fork the checkpoint writer: {pending.fork_error}"
                    )
                partial = pending.forked.wait()
                mine = self._hash_own_files(
                    storage, pending.directory, partial, rank, world, with_metadata=False
                )
            else:
                assert pending.future is not None
                metadata = pending.future.result()
                mine = self._hash_own_files(storage, pending.directory, metadata, rank, world)
        except (Exception, CheckpointException) as exc:
            error = _describe(exc)
        outcome: Manifest | str
        try:
            gathered: list[Any] = [(mine, error, partial)]
            if group is not None:
                # Only rank 0 needs them (partial metadata grows with the model).
                gathered = [None] * world if rank == 0 else None  # type: ignore[assignment]
                dist.gather_object((mine, error, partial), gathered, dst=0, group=group)
            outcome = "rank 0 did not answer"
            if rank == 0:
                try:
                    outcome = self._write_manifest(storage, pending, gathered, world)
                except OSError as exc:
                    outcome = f"writing {MANIFEST_NAME} failed: {exc}"
            outcome = _from_rank_0(outcome, group)
        except (Exception, CheckpointException) as exc:
            outcome = f"the ranks could not agree on the commit: {_describe(exc)}"
        if isinstance(outcome, Manifest):
            pending.committed = outcome
            if rank == 0:
                self._report_commit(pending, outcome)
                self._retain(storage, pending.step)
        else:
            pending.error = outcome
            if rank == 0 and pending.replaced is not None:
                self._restore_replaced(storage, pending)
        pending.done.set()

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
                found = self._candidates(wanted)
            except OSError as exc:
                found = f"cannot list {storage.root}: {exc}"
        found = _from_rank_0(found, group)
        if isinstance(found, str):
            raise CheckpointError(found)
        chosen: tuple[int, str] | None = None
        reasons: list[str] = []
        for step, directory, manifest in found:
            # Each rank hashes a share of the files; everyone sees every problem.
            problems = verify_files(storage, directory, list(manifest.files)[rank::world])
            if group is not None:
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, problems, group=group)
                problems = sorted(p for share in gathered for p in share)
            if not problems:
                chosen = (step, directory)
                break
            reason = f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
            reasons.append(f"step {step}: {reason}")
            if rank == 0:
                self._report_skip(step, directory, f"file {reason}; it does not match its manifest")
        if chosen is None:
            if wanted is not None:
                why = reasons[0] if reasons else "no committed checkpoint of that step"
                raise CheckpointError(f"cannot restore step {wanted}: {why}")
            return None
        step, directory = chosen
        stateful = _stateful(state)
        dcp.load(
            stateful,
            storage_reader=storage.reader(directory),
            process_group=group,
            no_dist=group is None,
        )
        for key, value in stateful.items():
            if not isinstance(value, (_ModelState, _OptimizerState)) and value is not state[key]:
                state[key] = value
        if rank == 0:
            warn(f"resumed from checkpoint step {step} ({directory})")
            self._report_restore(step, directory)
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
            raise CheckpointError(f"checkpoint {what} failed: {_describe(exc)}") from exc

    def _process_group(self) -> tuple[Any, int]:
        """(dedicated gloo group, rank), or (None, 0) in a process without a process group."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            if context().world_size > 1:
                raise CheckpointError("WORLD_SIZE > 1 but no process group: call air.init() first")
            # A world of one without a group is what we mean; DCP warns on every call (and
            # from its own thread, where catch_warnings would not reach).
            warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
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

    def _move_aside(self, storage: CheckpointStorage, directory: str, step: int) -> str | None:
        """Move a leftover `step-N` away; return its new path if it was a committed one."""
        committed = _is_committed(storage, directory, step)
        kind = "replaced" if committed else "trash"
        aside = storage.join(storage.root, f".{kind}-step-{step}-{uuid.uuid4().hex[:8]}")
        storage.move(directory, aside)
        return aside if committed else None

    def _restore_replaced(self, storage: CheckpointStorage, pending: _Pending) -> None:
        assert pending.replaced is not None
        try:
            failed = storage.join(
                storage.root, f".trash-step-{pending.step}-{uuid.uuid4().hex[:8]}"
            )
            if storage.exists(pending.directory):
                storage.move(pending.directory, failed)
            storage.move(pending.replaced, pending.directory)
        except OSError as exc:
            warn(f"could not put the earlier checkpoint of step {pending.step} back: {exc}")

    @staticmethod
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
        self, storage: CheckpointStorage, pending: _Pending, gathered: list[Any], world: int
    ) -> Manifest | str:
        errors = [f"rank {r}: {err}" for r, (_, err, _) in enumerate(gathered) if err]
        if errors:
            return "; ".join(errors)
        ctx = context()
        files = [e for entries, _, _ in gathered for e in entries]
        if pending.forked is not None:  # the ranks' parts of the metadata make one .metadata
            try:
                merged = merge_metadata([part for _, _, part in gathered])
            except ValueError as exc:
                return f"the ranks' checkpoint metadata do not fit together: {exc}"
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
        )
        storage.sync_dir(pending.directory)  # every data file's directory entry first
        storage.write_atomic(storage.join(pending.directory, MANIFEST_NAME), manifest.to_json())
        storage.sync_dir(storage.root)
        pending.durable_s = time.monotonic() - pending.started
        return manifest

    def _report_commit(self, pending: _Pending, manifest: Manifest) -> None:
        from air_sdk.runtime._shipper import get_shipper

        snapshot = "fork" if pending.forked is not None else "copy"
        get_shipper().add_checkpoint(
            manifest.commit_record(
                pending.directory, pending.blocked_s, pending.durable_s, snapshot=snapshot
            )
        )

    def _report_restore(self, step: int, directory: str) -> None:
        from air_sdk.runtime._shipper import get_shipper

        get_shipper().add_checkpoint(
            {"step": step, "path": directory, "restored": True, "attempt": context().attempt}
        )

    def _report_skip(self, step: int, directory: str, reason: str) -> None:
        from air_sdk.runtime._shipper import get_shipper

        warn(f"skipped checkpoint step {step}: {reason}")
        get_shipper().add_checkpoint(
            {"step": step, "path": directory, "skipped": reason, "attempt": context().attempt}
        )

    def _candidates(self, wanted: int | None) -> list[tuple[int, str, Manifest]]:
        """Rank 0: committed checkpoints, newest first (an invalid manifest is reported)."""
        assert self.storage is not None
        out = []
        for step, directory in list_step_dirs(self.storage):
            if wanted is not None and step != wanted:
                continue
            try:
                manifest = committed_manifest(self.storage, directory, step)
            except (ManifestError, OSError) as exc:
                self._report_skip(step, directory, f"{MANIFEST_NAME} is not valid ({exc})")
                continue
            if manifest is not None:  # no manifest: never committed, does not exist
                out.append((step, directory, manifest))
        return out

    def _retain(self, storage: CheckpointStorage, committed_step: int) -> None:
        """Rank 0, after a commit: apply `retention_victims`, then drop what was moved aside."""
        try:
            dirs = dict(list_step_dirs(storage))
            steps = [(step, _is_committed(storage, path, step)) for step, path in dirs.items()]
            for step in retention_victims(steps, keep=self.keep, just_committed=committed_step):
                # Uncommit first: a half-deleted directory must never look restorable.
                storage.remove_file(storage.join(dirs[step], MANIFEST_NAME))
                storage.remove_tree(dirs[step])
            for name in storage.list_dir(storage.root):
                if name.startswith((".trash-step-", ".replaced-step-", ".failure-step-")):
                    storage.remove_tree(storage.join(storage.root, name))
        except OSError as exc:
            warn(f"checkpoint retention failed ({exc}); old checkpoints were left in place")


def _is_committed(storage: CheckpointStorage, directory: str, step: int) -> bool:
    try:
        return committed_manifest(storage, directory, step) is not None
    except (ManifestError, OSError):
        return False


_instances: weakref.WeakSet[Checkpointer] = weakref.WeakSet()
_default: Checkpointer | None = None
_default_lock = threading.Lock()
_at_exit_registered = False


def _register_at_exit() -> None:
    global _at_exit_registered
    if not _at_exit_registered:
        # Registered after air.init()'s, so it runs first: commit, then destroy the group.
        atexit.register(_finalize_pending)
        _at_exit_registered = True


def _checkpointer() -> Checkpointer:
    global _default
    with _default_lock:
        if _default is None:
            _default = Checkpointer()
        return _default


def _finalize_pending() -> None:
    """Commit every save still in flight; warn about failures (air.shutdown and exit call this)."""
    for checkpointer in list(_instances):
        try:
            with checkpointer._lock:
                checkpointer._finish_pending(raise_error=False)
        except Exception as exc:  # shutdown must go on
            warn(f"finishing a checkpoint failed: {exc!r}")


def configure(
    directory: str | os.PathLike[str] | None = None,
    *,
    keep: int | None = None,
    on_failure: bool | None = None,
) -> Checkpointer:
    """Set where `save`/`load` keep checkpoints (default `AIR_CHECKPOINT_DIR`), how many
    committed ones to keep (default `AIR_CHECKPOINT_KEEP`, else 3) and whether a rank that
    survives a peer's death checkpoints the last completed step (default
    `AIR_CHECKPOINT_ON_FAILURE`, else on; see docs/failure-handling.md). Commits a save
    in flight.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.configure("/tmp/air-example-ckpt", keep=2).keep
        2
    """
    global _default
    replacement = Checkpointer(directory, keep=keep, on_failure=on_failure)
    with _default_lock:
        previous, _default = _default, replacement
    if previous is not None:
        previous.close()
    return replacement


def save(state: Mapping[str, Any], step: int, *, block: bool = False) -> None:
    """Save `state` as checkpoint `step` in the background (see the module docstring).

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.save({"model": model, "optim": optim}, step=100)  # doctest: +SKIP
    """
    _checkpointer().save(state, step, block=block)


def load(state: MutableMapping[str, Any], *, step: int | None = None) -> int | None:
    """Restore the newest intact checkpoint into `state`; its step, or None (nothing to resume).

    Example:
        >>> import air_sdk.runtime as air
        >>> start = air.checkpoint.load({"model": model, "optim": optim})  # doctest: +SKIP
    """
    return _checkpointer().load(state, step=step)


def latest() -> int | None:
    """The newest committed step, or None.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.latest()  # doctest: +SKIP
        100
    """
    return _checkpointer().latest()


def wait() -> int | None:
    """Block until the save in flight is committed; its step, or None if none was in flight.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.wait()  # doctest: +SKIP
        100
    """
    return _checkpointer().wait()


def close() -> None:
    """Commit the save in flight; raises CheckpointError if it failed.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.close()
    """
    if _default is not None:
        _default.close()
