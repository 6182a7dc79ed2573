"""A checkpoint at the moment of a failure, written by a rank that survived it.

In data-parallel training every rank holds the whole model and optimizer. When a
peer dies, the survivors' next gradient all-reduce fails (gloo: "Connection reset
by peer", within milliseconds) inside `loss.backward()`, before that step's
`optimizer.step()`: what they hold is the state after the last completed step.
Saving it then ("just-in-time" checkpointing) means a restart redoes nothing,
where restoring the last periodic checkpoint redoes everything since it (on
average half a checkpoint interval per failure).

It is only safe when the state at the failure is known to be exactly "after step
N". So it is written only when all of this holds, and otherwise a one-line
message says which did not (the restart then uses the last periodic checkpoint,
as always):

* the job runs under AIR (`AIR_JOB_ID`), with a local checkpoint directory, in a
  world of more than one rank on gloo (NCCL collectives wait for a dead peer rather
  than fail), and neither `air.checkpoint.configure(on_failure=False)`
  nor `AIR_CHECKPOINT_ON_FAILURE=0` turned it off;
* `air.checkpoint.save` or `load` saw the state, and it holds only
  DistributedDataParallel modules (replicated: a survivor has all of them),
  optimizers, LR schedulers, `air.resumable_loader`s / samplers and
  `air.data.ShardedDataset`s / `air.data.loader`s. A plain value
  or tensor could be changed by the loop between steps; a sharded module (FSDP2,
  tensor parallel: DTensor parameters) or a pipeline's model parts live partly on
  the dead rank, so for those a one-line message says why nothing was saved;
* the error that ends the script is a collective's failure, raised inside
  `backward()` (so that step's optimizer step has not run);
* every optimizer in the state stepped the same number k >= 1 of times since the
  save or load of step S, and `air.log` / `air.heartbeat` marked step S + k after
  the last of those steps: that is the step saved.

A loader's position is taken at each optimizer step (it has already handed out the
failing step's batch when the failure comes); the rest is saved as it is at the
failure. The rank writes a whole, single-process DCP checkpoint into a hidden
directory, hashes it, writes its manifest and renames the directory to `step-N`:
the first survivor to rename wins, the others drop theirs. SIGTERM is ignored while
it writes. Files under `$AIR_ATTEMPT_DIR/failure-saves/` coordinate with the runner
(on Ray it reads them through each node's actor), which usually sees the death first: `armed-rank-R` (this rank would save at a
failure) makes it give the ranks a moment to notice the failure before stopping them,
`rank-R` (saving now) makes it wait for the save, and `done-rank-R` (past the save,
or decided not to save) lets it stop the rank without waiting for it to exit (see
`JobController`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
import uuid
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from air_sdk.runtime._context import context
from air_sdk.runtime._poster import warn
from air_sdk.schema.worker_env import WorkerEnv

if TYPE_CHECKING:
    from air_sdk.runtime.checkpoint import Checkpointer

__all__ = ["ENV", "collective_failure", "ineligible_state", "track"]

#: `0` turns failure saves off
ENV = WorkerEnv.env_name("checkpoint_on_failure")
#: where a rank tells the runner about its failure save (under $AIR_ATTEMPT_DIR)
MARKER_DIR = "failure-saves"
#: what a collective's failure says where it is not a torch DistError (gloo's transport)
_COLLECTIVE_WORDS = ("third_party/gloo", "Connection reset by peer", "Connection closed by peer")
_BACKWARD_FILES = (os.path.join("torch", "_tensor.py"), os.path.join("torch", "autograd"))


class _Frozen:
    """A loader's position as of the last optimizer step, saved in the loader's place."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - Stateful
        raise NotImplementedError


class _Tracker:
    """What the failure save needs: the state, the step it was at, steps since."""

    def __init__(self, checkpointer: Checkpointer, state: Mapping[str, Any], step: int) -> None:
        import torch

        self.storage = checkpointer.storage  # not the checkpointer: it may be dropped
        self.state = state
        self.contents = dict(state)  # held: an id compared later must still be this object
        self.problem = ineligible_state(state) or _backend_problem()
        self.optimizers = [
            o
            for v in state.values()
            for o in (v if isinstance(v, (list, tuple)) else [v])
            if isinstance(o, torch.optim.Optimizer)
        ]
        self.loaders = {k: v for k, v in state.items() if _is_loader(v)}
        self.restart(step)

    def restart(self, step: int) -> None:
        """Count from `step` (just saved or loaded) again."""
        from air_sdk.runtime._shipper import get_shipper

        self.base_step = step
        self.steps = {id(o): 0 for o in self.optimizers}
        self.positions = {k: _position(v) for k, v in self.loaders.items()}
        self.marks_at_step = get_shipper().num_step_marks

    def on_optimizer_step(self, optimizer: Any) -> None:
        from air_sdk.runtime._shipper import get_shipper

        if id(optimizer) not in self.steps:
            return
        self.steps[id(optimizer)] += 1
        self.positions = {k: _position(v) for k, v in self.loaders.items()}
        self.marks_at_step = get_shipper().num_step_marks

    def step_to_save(self) -> tuple[int | None, str]:
        """(the step the state is at, "") or (None, why it is not known)."""
        from air_sdk.runtime._shipper import get_shipper

        if not self.steps:
            return None, "no optimizer in the state: its steps are what count completed steps"
        counts = set(self.steps.values())
        if len(counts) != 1:
            return None, "the optimizers in the state stepped different numbers of times"
        k = counts.pop()
        if k == 0:
            return None, f"no optimizer step since step {self.base_step} was saved or loaded"
        shipper = get_shipper()
        if shipper.num_step_marks == self.marks_at_step:
            return None, "no air.log(step=...) after the last optimizer step"
        if shipper.last_step != self.base_step + k:
            return None, (
                f"air.log marked step {shipper.last_step} but {k} optimizer steps after step"
                f" {self.base_step} make {self.base_step + k} (one optimizer step per logged"
                " step is what a failure save can vouch for)"
            )
        return self.base_step + k, ""


_tracker: _Tracker | None = None
_hooked: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_hook_lock = threading.Lock()
_previous_hook: Any = None
_armed = False


def track(checkpointer: Checkpointer, state: Mapping[str, Any], step: int) -> None:
    """After a save or load of `step` (0: nothing was loaded): follow `state` from here."""
    global _tracker
    ctx = context()
    if not (checkpointer.on_failure and ctx.job_id and ctx.world_size > 1):
        _tracker = None
        _arm(False)
        return
    tracker = _tracker
    if (
        tracker is not None
        and tracker.storage is checkpointer.storage
        and _same(tracker.contents, state)
    ):
        tracker.restart(step)  # the same objects saved again: nothing to check or hook anew
        return
    tracker = _Tracker(checkpointer, state, step)
    with _hook_lock:
        for optimizer in tracker.optimizers:
            if optimizer not in _hooked:
                _hooked[optimizer] = optimizer.register_step_post_hook(_on_step)
        _tracker = tracker
        _install_excepthook()
    _arm(tracker.problem is None)


def _arm(armed: bool) -> None:
    """`failure-saves/armed-rank-R`: this rank would save at a failure, so the runner
    gives it a moment to notice one before stopping it."""
    global _armed
    if armed == _armed:
        return
    path = _marker("armed-rank")
    if path is None:
        return
    try:
        if armed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.unlink(missing_ok=True)
        _armed = armed
    except OSError as exc:
        warn(f"cannot write {path}: {exc}")


def _same(held: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """Whether `state` holds the very objects `held` does (a tracker is reused then)."""
    return held.keys() == state.keys() and all(held[k] is v for k, v in state.items())


def _on_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
    tracker = _tracker
    if tracker is not None:
        tracker.on_optimizer_step(optimizer)


def _is_loader(value: Any) -> bool:
    kinds = [
        getattr(sys.modules.get(module), name, None)
        for module, name in (
            ("air_sdk.runtime.data", "StatefulDistributedSampler"),
            ("air_sdk.runtime.data", "ResumableLoader"),
            ("air_sdk.runtime.data._sharded", "ShardedDataset"),
            ("air_sdk.runtime.data._stream_loader", "StreamLoader"),
        )
    ]
    return isinstance(value, tuple(k for k in kinds if k is not None))


def _position(loader: Any) -> dict[str, Any]:
    # A ShardedDataset's state_dict() agrees on the position with a collective, which
    # cannot run once a peer died (nor at every optimizer step): under data parallelism,
    # the only layout a failure save covers, each rank consumed as many batches, so its
    # own view is everyone's.
    local = getattr(loader, "local_state_dict", None)
    return local() if local is not None else loader.state_dict()


def ineligible_state(state: Mapping[str, Any]) -> str | None:
    """Why a survivor's copy of `state` may not be the whole state after a step; None if it is.

    Only data parallelism over replicas qualifies: a sharded module (FSDP2, tensor
    parallel: DTensor parameters) or the model parts of a pipeline live partly on the
    dead rank, so a survivor holds part of the state and must not save it.

    Example:
        >>> ineligible_state({"epoch": 3})
        "state['epoch'] (int) may have changed since the last completed step"
    """
    import torch
    from torch.distributed.tensor import DTensor
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    def sharded(module: torch.nn.Module) -> bool:
        return any(isinstance(p, DTensor) for p in module.parameters())

    for key, value in state.items():
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.nn.Module) for v in value):
            return (
                f"state[{key!r}] holds model parts (pipeline stages): the other stages"
                " lived on other ranks, some of them dead"
            )
        if isinstance(value, torch.nn.Module) and sharded(value):
            return (
                f"state[{key!r}] has sharded (DTensor) parameters (FSDP or tensor parallel):"
                " the dead rank held part of them"
            )
        if isinstance(value, torch.nn.Module) and not isinstance(
            value, torch.nn.parallel.DistributedDataParallel
        ):
            return (
                f"state[{key!r}] ({type(value).__name__}) is not DistributedDataParallel:"
                " the surviving ranks may not hold all of it"
            )
        optimizers = value if isinstance(value, (list, tuple)) and value else [value]
        if isinstance(value, torch.nn.Module) or all(
            isinstance(v, (torch.optim.Optimizer, LRScheduler, ReduceLROnPlateau))
            for v in optimizers
        ):
            continue
        if not _is_loader(value):
            return f"state[{key!r}] ({type(value).__name__}) may have changed since the last completed step"
    return None


def _backend_problem() -> str | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() != "gloo":
        return (
            f"the {dist.get_backend()} backend's collectives wait for a dead peer instead of"
            " failing"
        )
    return None


def collective_failure(exc: BaseException, tb: TracebackType | None) -> bool:
    """Whether `exc` is a collective that failed (a peer died) inside `backward()`."""
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", ())
    text = str(exc)
    if not (
        (dist_error and isinstance(exc, dist_error))
        or (isinstance(exc, RuntimeError) and any(w in text for w in _COLLECTIVE_WORDS))
    ):
        return False
    return any(
        frame.name == "backward" and any(part in frame.filename for part in _BACKWARD_FILES)
        for frame in traceback.extract_tb(tb)
    )


def _install_excepthook() -> None:
    global _previous_hook
    if _previous_hook is None:
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    try:
        if _tracker is not None and collective_failure(exc, tb):
            save_at_failure(_tracker)
    except Exception as error:  # the original error must still be reported
        warn(f"no checkpoint at the failure: {error!r}")
    finally:
        _decided()
        (_previous_hook or sys.__excepthook__)(exc_type, exc, tb)


def _decided() -> None:
    """`failure-saves/done-rank-R`: an armed rank is past its save (or chose not to
    save), so the runner need not wait for it to exit: leaving after a peer's death
    can take a while (the process group's teardown), and the runner stops it anyway."""
    if not _armed:
        return
    path = _marker("done-rank")
    if path is not None:
        try:
            path.touch()
        except OSError:
            pass  # the runner then waits for the exit, as without markers


def save_at_failure(tracker: _Tracker) -> int | None:
    """Write the failure checkpoint; its step, or None (and a message why not)."""
    from air_sdk.runtime._storage import LocalStorage

    storage = tracker.storage
    step, why = tracker.step_to_save()
    if tracker.problem:
        why = tracker.problem
    elif not isinstance(storage, LocalStorage):
        why = "the checkpoint directory is not a local path (a rename must commit it)"
    if step is None or why:
        warn(f"no checkpoint at the failure: {why}; the restart resumes from the last save")
        return None
    assert isinstance(storage, LocalStorage)
    marker = _marker()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the runner waits for the marker
    try:
        if marker is not None:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(step))
        saved = _write(storage, tracker, step)
        from air_sdk.runtime._shipper import get_shipper

        get_shipper().flush(timeout=2.0)  # the commit event, before the runner stops us
        return saved
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, previous)


def _marker(kind: str = "rank") -> Path | None:
    attempt_dir = os.environ.get(WorkerEnv.env_name("attempt_dir"))
    if not attempt_dir:
        return None
    return Path(attempt_dir) / MARKER_DIR / f"{kind}-{context().rank}"


def _write(storage: Any, tracker: _Tracker, step: int) -> int | None:
    import torch.distributed.checkpoint as dcp

    from air_sdk.runtime._fork_snapshot import state_dicts
    from air_sdk.runtime._manifest import MANIFEST_NAME, FileEntry, Manifest, step_dir_name
    from air_sdk.runtime.checkpoint._adapters import layout, state_kinds, stateful
    from air_sdk.runtime.checkpoint._checkpointer import NO_DIST_WARNING
    from air_sdk.runtime.checkpoint._commit import is_committed

    started = time.monotonic()
    ctx = context()
    state = {
        k: _Frozen(tracker.positions[k]) if k in tracker.loaders else v
        for k, v in tracker.state.items()
    }
    flat = state_dicts(stateful(state))
    final = storage.join(storage.root, step_dir_name(step))
    if is_committed(storage, final, step):
        return step  # another survivor was faster
    tmp = storage.join(storage.root, f".failure-step-{step}-rank-{ctx.rank}-{uuid.uuid4().hex[:8]}")
    storage.make_dirs(tmp)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.filterwarnings("ignore", message=NO_DIST_WARNING)
            dcp.save(flat, storage_writer=storage.writer(tmp), no_dist=True)
        files = []
        for name in storage.list_dir(tmp):
            size, sha = storage.digest(storage.join(tmp, name))
            files.append(FileEntry(path=name, size=size, sha256=sha))
        manifest = Manifest(
            step=step,
            world_size=ctx.world_size,
            files=tuple(files),
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            data_position=tracker.positions or None,
            parallelism=layout(tracker.state),
            state_kinds=state_kinds(tracker.state),
        )
        storage.sync_dir(tmp)
        storage.write_atomic(storage.join(tmp, MANIFEST_NAME), manifest.to_json())
        if storage.exists(final):  # a leftover no one committed (a torn periodic save)
            storage.move(
                final, storage.join(storage.root, f".trash-step-{step}-{uuid.uuid4().hex[:8]}")
            )
        try:
            os.rename(tmp, final)  # fails if another survivor's is in place: theirs stands
        except OSError:
            return step if is_committed(storage, final, step) else None
        storage.sync_dir(storage.root)
    finally:
        storage.remove_tree(tmp)
    durable = time.monotonic() - started
    warn(f"saved checkpoint step {step} at the failure ({final}, {durable:.2f} s)")
    from air_sdk.runtime._shipper import get_shipper

    get_shipper().add_checkpoint(manifest.commit_record(final, durable, durable, at_failure=True))
    return step
