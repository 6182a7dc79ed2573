"""Checkpoints that survive crashes: `air.checkpoint.save(state, step=...)` and
`step = air.checkpoint.load(state)`.

```python
import air_sdk.runtime as air

air.init()
state = {"model": model, "optim": optim, "data": loader, "epoch": 0}
start = air.checkpoint.load(state)        # None: nothing to resume; else the step, state restored
for step in range((start or 0) + 1, num_steps + 1):
    train_step()
    if air.checkpoint.due(step, every=100):    # every 100 steps, or the job's --checkpoint-every
        air.checkpoint.save(state, step=step)  # blocks only while the state is snapshotted
air.shutdown()                            # commits the save still in flight
```

`state` maps names to modules (plain, DDP, FSDP2, tensor-parallel, compiled or
activation-checkpointed), lists of modules (the model parts a rank holds under
pipeline parallelism), optimizers (or a list of them, one per model part), anything
with `state_dict()`/`load_state_dict()` (LR schedulers, `air.resumable_loader`), and
small plain values (numbers, strings, dicts and lists of them), which `load` writes
back into the dict. Modules and optimizers go through
`torch.distributed.checkpoint.state_dict` (`_adapters`): keys are the unwrapped
model's parameter names (no `module.`, `_orig_mod.`, `_checkpoint_wrapped_module.`),
an optimizer's state is keyed by them too, and sharded parameters stay DTensors.
Every rank passes the same keys, and `load` needs the keys the checkpoint was saved
with. A plain value is saved once (from one rank): keep a value that differs between
ranks under a per-rank key. Saving before the first optimizer step creates the
optimizer's state (as `get_optimizer_state_dict` does), e.g. Adam's step count.

Any layout. A checkpoint loads under another layout or world size than it was saved
under: saved under FSDP(4), it resumes under TP(2) x FSDP(2), on 2 ranks, or in one
process; saved by 2 pipeline stages, it loads into 1 or 4 (each stage keeps the full
model's names for its layers). DCP reshards on load, reading the pieces the DTensors
of the new layout need. The manifest records the layout (`AIR_PARALLELISM`'s sizes)
it was saved under; `load` says in its log line when it resharded. `air checkpoints
export` (`air_sdk.checkpoints.export`) writes a checkpoint's model as one
safetensors file of full tensors.

Snapshot. `save` returns once it holds a snapshot of the state, taken one of two
ways (`AIR_CHECKPOINT_SNAPSHOT`, default `copy`):

* `fork`: the training thread builds the state dict (the `state_dict()` of the
  wrappers above, so lazily created optimizer state exists in this process), the
  ranks agree on who writes which replicated tensor (DCP's dedup), and the training
  thread forks (from another thread, CPython would clear the training thread's state
  in the child, running destructors there). The child writes this rank's part of the
  standard DCP layout (`__<rank>_*.distcp`) from its copy-on-write view of memory,
  with no collective, hands its part of DCP's metadata back, and always leaves with
  `os._exit`; it dies with the thread that called `save` (PR_SET_PDEATHSIG). The save
  blocks for the state dict and the fork, not for a copy; the copy is paid later,
  page by page, by the parent's first write to each page while the child is alive
  (the next optimizer step), and memory grows by up to one copy of the state until the child exits. See
  `air_sdk.runtime._fork_snapshot`.
* `copy`: `dcp.async_save` copies the state into CPU memory, then writes it.

`auto` forks on Linux (not macOS) when every tensor of the state is on the CPU and
the storage is a local directory (LocalStorage, or fsspec `file://`); else it copies.
`fork` forces the fork and raises CheckpointError where it is unsafe (a CUDA tensor:
forking a CUDA process is undefined; an in-memory store the child cannot share).
Every rank uses the same mode: fork only if all can.

Commit protocol (`_commit`). Each save writes `<dir>/step-<step>` (a leftover
there is moved aside first, never written over). A commit thread waits for the
writer (DCP's future, or the forked child: reaped with waitpid, its exit status or
signal is the save's error), hashes this rank's files, gathers every rank's (path,
size, sha256) on rank 0, which (fork) merges the ranks' metadata into `.metadata`,
written atomically and hashed, fsyncs the directory and writes `manifest.json` last
(tmp, fsync, rename, fsync), then broadcasts the outcome and applies retention. A
directory without a valid manifest does not exist for restore. DCP's own background
thread already issues collectives, so all checkpoint traffic runs on a dedicated
gloo group that only one thread uses at a time: the commit thread while a save is in
flight, the training thread (save's barrier, load) only once no save is. Training
collectives stay on the default group. Committing in the background, rather than at
the next save, makes a checkpoint restorable seconds after it was taken, not one
interval later.

Modules: `_adapters` (state -> what DCP sees), `_snapshot` (the copy and fork
writers behind one interface), `_commit` (manifest, retention, reports),
`_checkpointer` (`Checkpointer`: the guard, save and load), `export` (a checkpoint's
model as safetensors); the manifest, storage, fork child and failure save live in
`air_sdk.runtime._manifest`, `_storage`, `_fork_snapshot` and `_failure_save`.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any

from air_sdk.errors import CheckpointError
from air_sdk.runtime._external_checkpoint import record as record
from air_sdk.runtime._poster import warn
from air_sdk.runtime.checkpoint._checkpointer import Checkpointer, instances

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "close",
    "configure",
    "due",
    "latest",
    "load",
    "record",
    "save",
    "wait",
]

_default: Checkpointer | None = None
_default_lock = threading.Lock()
_at_exit_registered = False


def register_at_exit() -> None:
    """Commit what is in flight at exit (once; `Checkpointer.save` calls it)."""
    global _at_exit_registered
    if not _at_exit_registered:
        # Registered after air.init()'s, so it runs first: commit, then destroy the group.
        atexit.register(_finalize_pending)
        _at_exit_registered = True


def _default_checkpointer() -> Checkpointer:
    global _default
    with _default_lock:
        if _default is None:
            _default = Checkpointer()
        return _default


def _finalize_pending() -> None:
    """Commit every save still in flight; warn about failures (air.shutdown and exit call this)."""
    for checkpointer in list(instances):
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


@functools.cache
def _every_env() -> str:
    from air_sdk.schema.worker_env import WorkerEnv  # pydantic: loaded when first asked

    return WorkerEnv.env_name("checkpoint_every")


def due(step: int, *, every: int | None = None, env: Mapping[str, str] | None = None) -> bool:
    """True when `step` (counted from 1) is a step to checkpoint at: a multiple of the
    job's interval (`air submit --checkpoint-every N`, `AIR_CHECKPOINT_EVERY`), or of
    `every` when the job set none. False at step 0 and when neither sets an interval.

    The job's setting wins over the code's `every`, so one script runs with the interval
    each submit asks for.

    Example:
        >>> import air_sdk.runtime as air
        >>> [s for s in range(1, 11) if air.checkpoint.due(s, env={"AIR_CHECKPOINT_EVERY": "4"})]
        [4, 8]
        >>> air.checkpoint.due(6, every=3, env={}), air.checkpoint.due(6, env={})
        (True, False)
    """
    name = _every_env()
    raw = (os.environ if env is None else env).get(name, "").strip()
    if raw:
        try:
            every = int(raw)
        except ValueError:
            every = 0
        if every < 1:
            raise CheckpointError(
                f"{name}={raw!r} is not a whole number of steps >= 1: unset it, or"
                " submit with --checkpoint-every N"
            )
    elif every is not None and every < 1:
        raise CheckpointError(f"every={every}: give a whole number of steps >= 1, or None")
    return every is not None and step > 0 and step % every == 0


def save(state: Mapping[str, Any], step: int, *, block: bool = False) -> None:
    """Save `state` as checkpoint `step` in the background (see the module docstring).

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.save({"model": model, "optim": optim}, step=100)  # doctest: +SKIP
    """
    _default_checkpointer().save(state, step, block=block)


def load(state: MutableMapping[str, Any], *, step: int | None = None) -> int | None:
    """Restore the newest intact checkpoint into `state`; its step, or None (nothing to resume).

    Example:
        >>> import air_sdk.runtime as air
        >>> start = air.checkpoint.load({"model": model, "optim": optim})  # doctest: +SKIP
    """
    return _default_checkpointer().load(state, step=step)


def latest() -> int | None:
    """The newest committed step, or None.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.latest()  # doctest: +SKIP
        100
    """
    return _default_checkpointer().latest()


def wait() -> int | None:
    """Block until the save in flight is committed; its step, or None if none was in flight.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.wait()  # doctest: +SKIP
        100
    """
    return _default_checkpointer().wait()


def close() -> None:
    """Commit the save in flight; raises CheckpointError if it failed.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.close()
    """
    if _default is not None:
        _default.close()
