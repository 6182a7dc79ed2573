"""The "fork" snapshot of `air.checkpoint.save`: a copy-on-write child process writes the checkpoint.

The parent builds the state dict (the `state_dict()` of every stateful entry), then
forks; the child sees the memory of that moment, copy-on-write, and writes this rank's
part in DCP's file layout (`__<rank>_<n>.distcp`) without any collective, while the
parent trains on. The child hands back its partial DCP `Metadata` through an anonymous
file and always leaves with `os._exit`. Rank 0 of the parent merges the partial
metadata of every rank into the one `.metadata` that `dcp.load` reads.

What a rank writes is what `dcp.save` would have it write: every rank its DTensor
shards (FSDP2), rank 0 the plain values, and each replicated tensor (DDP) once, from
the rank DCP's own dedup picks (it balances the bytes across ranks). The ranks' local
plans are all-gathered once in the training thread, as `dcp.save` does, and every rank
runs the same dedup on them: the child needs no collective.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from air_sdk.errors import CheckpointError
from air_sdk.runtime._fork_gc import forks_keep_garbage_in_the_parent
from air_sdk.schema.worker_env import WorkerEnv

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = [
    "MODES",
    "WRITER_NAME",
    "ForkedWrite",
    "choose_mode",
    "local_plan",
    "my_share",
    "merge_metadata",
    "requested_mode",
    "state_dicts",
]

ENV = WorkerEnv.env_name("checkpoint_snapshot")
#: The writer's process name (/proc/<pid>/comm, psutil's name()). It shares its trainer's
#: environment and command line (RANK, AIR_JOB_ID), like a DataLoader worker: a rank is
#: the NodeRunner's own child (`air_sdk.runner.node`), so the writer is never taken for one.
WRITER_NAME = "air-ckpt-writer"
MODES = ("copy", "fork", "auto")
_EXIT_OK, _EXIT_ERROR, _EXIT_UNREPORTED = 0, 1, 2

# 3.12+ warns that fork() in a threaded process may deadlock the child: this child only
# writes files with torch's serializer and leaves with os._exit.
warnings.filterwarnings(
    "ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning
)

#: Tests set this to run code in the child before it writes (e.g. to kill it).
_child_hook: Callable[[int], None] | None = None


def requested_mode() -> str:
    """`AIR_CHECKPOINT_SNAPSHOT` (copy, fork or auto; default copy)."""
    raw = os.environ.get(ENV, "").strip().lower() or "copy"
    if raw not in MODES:
        raise CheckpointError(
            f"{ENV}={os.environ.get(ENV)!r} is not one of {', '.join(MODES)} "
            "(copy: the default; auto: fork where it is safe, else copy)"
        )
    return raw


def state_dicts(stateful: Mapping[str, Any]) -> dict[str, Any]:
    """What `dcp.save` would save: each stateful entry's `state_dict()`, the rest as it is."""
    from torch.distributed.checkpoint.stateful import Stateful

    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in stateful.items()}


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def choose_mode(requested: str, state: Mapping[str, Any], storage: Any, writer: Any) -> str:
    """ "fork" or "copy" for this save; CheckpointError where `fork` was asked for and is unsafe."""
    if requested == "copy":
        return "copy"
    unsafe = _fork_unsafe(state, writer)
    if requested == "fork":
        if unsafe is not None:
            raise CheckpointError(f"{ENV}=fork cannot be used: {unsafe}; set {ENV}=copy")
        return "fork"
    if unsafe is not None or not _plain_local_storage(storage):
        return "copy"
    return "fork"


def _fork_unsafe(state: Mapping[str, Any], writer: Any) -> str | None:
    from torch.distributed.checkpoint.filesystem import _FileSystemWriter

    if not hasattr(os, "fork") or sys.platform == "darwin":
        return f"this platform ({sys.platform}) has no safe os.fork"
    for tensor in _tensors(state):
        if tensor.device.type != "cpu":
            return (
                f"the state holds a {tensor.device.type} tensor, and forking a process that "
                "uses an accelerator is unsafe"
            )
    if not isinstance(writer, _FileSystemWriter):
        return f"the storage's writer ({type(writer).__name__}) is not a DCP file-system writer"
    if "memory" in _protocols(writer):
        return "an in-memory fsspec store is not shared with the child process that writes"
    return None


def _protocols(writer: Any) -> tuple[str, ...]:
    fs = getattr(getattr(writer, "fs", None), "fs", None)  # FsspecWriter: FileSystem.fs
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _plain_local_storage(storage: Any) -> bool:
    """`auto` forks only for the built-in storages writing to local files: a custom
    storage may hold in-process state (threads, events, memory) a child cannot share,
    and an object store's client is not known to survive a fork."""
    from air_sdk.runtime._storage import FsspecStorage, LocalStorage

    if type(storage) is LocalStorage:
        return True
    return type(storage) is FsspecStorage and bool(storage._local)


def local_plan(state: dict[str, Any], rank: int) -> Any:
    """This rank's DCP save plan (what it holds), as the default planner makes it."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.default_planner import create_default_local_save_plan

    flattened, _ = flatten_state_dict(state)
    return create_default_local_save_plan(flattened, rank == 0)


def my_share(plans: list[Any], rank: int) -> set[Any]:
    """The items (MetadataIndex) `rank` writes once DCP's dedup has spread the
    replicated ones over the ranks; the same answer on every rank."""
    from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans

    return {item.index for item in dedup_save_plans(plans)[rank].items}


class ForkedWrite:
    """One child process writing one rank's part of one checkpoint; `share` is the set
    of items it writes (None: all of them, a world of one)."""

    def __init__(
        self, state: dict[str, Any], writer: Any, rank: int, share: set[Any] | None = None
    ) -> None:
        self.state = state
        self.writer = writer
        self.rank = rank
        self.share = share
        self.pid: int | None = None
        self._result: Any = None
        self._forker: threading.Thread | None = None

    def start(self) -> None:
        """Fork; the child writes and exits. Raises OSError if the fork fails.

        Call it from the thread that trains: the child dies with the thread that forked
        it, and CPython clears every other thread's state in the child, which runs the
        destructors of what they kept (torch's per-thread DTensor sharding cache holds
        device meshes and through them process groups; a gloo group's destructor waits
        forever for worker threads the child does not have)."""
        _preload()
        self._forker = threading.current_thread()
        # Anonymous (unlinked) and shared with the child: nothing to clean up after a crash.
        self._result = tempfile.TemporaryFile(prefix="air-ckpt-fork-")  # noqa: SIM115
        parent = os.getpid()
        try:
            with forks_keep_garbage_in_the_parent():
                pid = os.fork()
        except BaseException:
            self._result.close()
            raise
        if pid == 0:
            _child_main(
                self.state, self.writer, self.rank, self.share, self._result.fileno(), parent
            )
        self.pid = pid
        self.state = {}  # the child has its copy; do not keep the parent's tensors alive

    def wait(self) -> Metadata:
        """Wait for the child; its partial Metadata, or CheckpointError saying why not."""
        assert self.pid is not None and self._result is not None
        try:
            while True:
                try:
                    _, status = os.waitpid(self.pid, 0)
                    break
                except InterruptedError:  # pragma: no cover - PEP 475 retries already
                    continue
                except ChildProcessError:
                    raise CheckpointError(
                        f"the checkpoint writer process (pid {self.pid}) was reaped by someone "
                        "else (a SIGCHLD handler?), so its outcome is unknown"
                    ) from None
            self._result.seek(0)
            raw = self._result.read()
        finally:
            self._result.close()
        who = f"the forked checkpoint writer (pid {self.pid})"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            why = f"{who} was killed by signal {sig} ({_signal_name(sig)})"
            if sig == signal.SIGKILL and self._forker is not None and not self._forker.is_alive():
                why += (
                    f": the thread that called save ({self._forker.name}) ended before the "
                    "write did, and the writer dies with it; wait() for the save in that "
                    "thread, or save from the main thread"
                )
            raise CheckpointError(why)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        outcome = _unpickle(raw)
        if code == _EXIT_OK and isinstance(outcome, tuple) and outcome[0] == "ok":
            return outcome[1]
        if isinstance(outcome, tuple) and outcome[0] == "error":
            raise CheckpointError(f"{who} failed (exit status {code}): {outcome[1]}")
        raise CheckpointError(f"{who} exited with status {code} without reporting a result")


def _preload() -> None:
    """Import here what the child runs: an import in the child could wait forever for a
    module lock that another thread of the parent held at the fork."""
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.checkpoint._dedup_save_plans  # noqa: F401
    import torch.distributed.checkpoint._nested_dict  # noqa: F401
    import torch.distributed.checkpoint.default_planner  # noqa: F401
    import torch.distributed.checkpoint.filesystem  # noqa: F401
    import torch.distributed.checkpoint.state_dict_saver  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    import air_sdk.runtime.supervise  # noqa: F401


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _unpickle(raw: bytes) -> Any:
    try:
        return pickle.loads(raw) if raw else None
    except Exception:  # a child killed mid-write leaves a torn result
        return None


def _child_main(
    state: dict[str, Any], writer: Any, rank: int, share: set[Any] | None, fd: int, parent: int
) -> None:
    """The child: write, report, `os._exit` whatever happens (no atexit, no finalizers)."""
    code = _EXIT_UNREPORTED
    try:
        _detach(parent)
        if _child_hook is not None:
            _child_hook(rank)
        try:
            result: tuple[str, Any] = ("ok", _write(state, writer, rank, share))
        except BaseException as exc:
            result = ("error", _describe(exc))
        data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        code = _EXIT_OK if result[0] == "ok" else _EXIT_ERROR
    except BaseException:
        pass
    finally:
        os._exit(code)


def _set_name(name: str) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux: the name stays
        pass


def _describe(exc: BaseException) -> str:
    from torch.distributed.checkpoint import CheckpointException

    if isinstance(exc, CheckpointException):  # its str() is a traceback per rank
        return "; ".join(sorted({repr(e) for e, _ in exc.failures.values()})) or str(exc)
    return f"{type(exc).__name__}: {exc}"


def _detach(parent: int) -> None:
    """Die with the parent; leave signals meant for the trainer to the trainer."""
    import gc

    from air_sdk.runtime.supervise import set_parent_death_signal

    # No collection here: it would run finalizers of objects the parent made (a DataLoader
    # iterator's would signal the parent's workers). What the parent had is frozen
    # (ForkedWrite.start); what the write makes is freed by _exit. The child lives seconds.
    gc.disable()
    # Tied to the forking thread (the one that called save): see ForkedWrite.wait.
    set_parent_death_signal(signal.SIGKILL)
    _set_name(WRITER_NAME)
    if os.getppid() != parent:  # the parent died before the death signal was set
        os._exit(_EXIT_UNREPORTED)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # the parent decides; it waits for us on exit
    warnings.simplefilter("ignore")
    threading.excepthook = lambda _args: None


def _write(state: dict[str, Any], writer: Any, rank: int, share: set[Any] | None) -> Metadata:
    """This rank's part, no collectives: DCP's own single-process save, with the writer
    told the rank (so its files are `__<rank>_*`) and the metadata kept, not written."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

    captured: list[Metadata] = []

    def set_up_storage_writer(is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        writer.rank = rank
        writer.use_collectives = False  # prefix __<rank>_, per DCP's own no-collective mode

    def finish(metadata: Metadata, results: list[list[Any]]) -> None:
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.storage_meta = writer.storage_meta()
        captured.append(metadata)

    writer.set_up_storage_writer = set_up_storage_writer
    writer.finish = finish
    # DCP's overlapping loader touches the accelerator's streams wherever CUDA is
    # available; a child forked from a process that initialized CUDA must never do so.
    writer.per_thread_copy_ahead = 0
    dcp.save(state, storage_writer=writer, planner=_rank_planner(share), no_dist=True)
    return captured[0]


def _rank_planner(share: set[Any] | None) -> Any:
    from collections import ChainMap

    from torch.distributed.checkpoint.default_planner import (
        DefaultSavePlanner,
        create_default_global_save_plan,
    )

    class RankPlanner(DefaultSavePlanner):
        """DCP's default plan, cut to this rank's share. No global validation here: one
        rank's chunks do not cover a sharded tensor; `merge_metadata` checks the union."""

        def create_local_plan(self) -> Any:
            plan = super().create_local_plan()
            if share is not None:
                items = [item for item in plan.items if item.index in share]
                plan = self.plan = dataclasses.replace(plan, items=items)
            return plan

        def _create_global_plan(self, all_plans: list[Any]) -> tuple[list[Any], Any]:
            plans, metadata = create_default_global_save_plan(all_plans)
            if self.flatten_state_dict:
                mappings = dict(ChainMap(*[p.planner_data for p in plans]))
                metadata = dataclasses.replace(metadata, planner_data=mappings)
            return plans, metadata

    return RankPlanner()


def merge_metadata(partials: list[Metadata]) -> Metadata:
    """One `.metadata` from every rank's part (rank order): the union of each key's
    chunks, of the storage entries and of the planner mappings. ValueError where the
    parts disagree or a tensor's chunks do not add up to the whole of it."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    state_md: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    planner: dict[str, Any] = {}
    for rank, part in enumerate(partials):
        for key, md in part.state_dict_metadata.items():
            have = state_md.get(key)
            if have is None:
                state_md[key] = (
                    dataclasses.replace(md, chunks=list(md.chunks))
                    if isinstance(md, TensorStorageMetadata)
                    else md
                )
                continue
            if not (isinstance(have, TensorStorageMetadata) and isinstance(md, type(have))):
                raise ValueError(f"rank {rank} saved {key!r} again (one rank writes it)")
            if have.size != md.size or have.properties.dtype != md.properties.dtype:
                raise ValueError(f"the ranks disagree about the shape or dtype of {key!r}")
            seen = {(tuple(c.offsets), tuple(c.sizes)) for c in have.chunks}
            for chunk in md.chunks:
                if (tuple(chunk.offsets), tuple(chunk.sizes)) not in seen:
                    have.chunks.append(chunk)  # a replicated shard is kept once, first rank's
        for index, info in part.storage_data.items():
            storage.setdefault(index, info)
        planner.update({k: v for k, v in (part.planner_data or {}).items() if k not in planner})
    for key, md in state_md.items():
        if isinstance(md, TensorStorageMetadata):
            whole = math.prod(md.size)
            covered = sum(math.prod(c.sizes) for c in md.chunks)
            if covered != whole:
                raise ValueError(
                    f"the saved chunks of {key!r} cover {covered} of its {whole} elements"
                )
    first = partials[0]
    return Metadata(
        state_dict_metadata=state_md,
        planner_data=planner,
        storage_data=storage,
        storage_meta=first.storage_meta,
        version=first.version,
    )
