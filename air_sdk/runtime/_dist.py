"""Process-group setup and a teardown that does not crash at exit.

torch is imported only inside these functions, so `import air_sdk.runtime`
stays light in every rank and in the supervisor.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from datetime import timedelta
from typing import Any

from air_sdk.errors import ConfigError
from air_sdk.runtime._context import Context, context
from air_sdk.runtime._shipper import get_shipper, keep_alive
from air_sdk.schema.worker_env import WorkerEnv

__all__ = ["init", "shutdown"]

_LAUNCH_VARS = tuple(
    WorkerEnv.env_name(f) for f in ("rank", "world_size", "master_addr", "master_port")
)
_lock = threading.Lock()
_atexit_registered = False
_shut_down = False


def _default_backend(torch: Any, ctx: Context) -> str:
    # Every rank decides alone, so the rule must give the same answer on every
    # node of a homogeneous job: NCCL when this node has a GPU per local rank.
    if torch.cuda.is_available() and torch.cuda.device_count() >= ctx.local_world_size:
        return "nccl"
    return "gloo"


def _launched(ctx: Context) -> bool:
    missing = [name for name in _LAUNCH_VARS if not os.environ.get(name)]
    if not missing:
        return True
    if ctx.world_size > 1:
        raise ConfigError(
            f"WORLD_SIZE={ctx.world_size} but {', '.join(missing)} not set: launch with torchrun "
            "or `air run`, or unset WORLD_SIZE to run as a single process"
        )
    return False


def init(backend: str | None = None, timeout_s: float = 300.0) -> Context:
    """Join the job's process group (or make a 1-process one) and return this rank's Context.

    Reads torchrun's env (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`). When
    they are absent, makes a world of one on a free 127.0.0.1 port, so the same
    script runs by hand. Backend: "nccl" when this node has a GPU per local rank
    (and then `torch.cuda.set_device(LOCAL_RANK)`), else "gloo". Collectives time
    out after `timeout_s` (torch's gloo default would be 30 minutes). Does nothing
    to a process group that is already initialized. `shutdown()` runs at exit.

    Example:
        >>> import air_sdk.runtime as air
        >>> ctx = air.init()  # doctest: +SKIP
        >>> ctx.world_size  # doctest: +SKIP
        1
    """
    global _atexit_registered, _shut_down
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    import torch
    import torch.distributed as dist

    ctx = context()
    if not dist.is_available():
        raise ConfigError("this torch build has no torch.distributed; install a standard wheel")
    if dist.is_initialized():
        return ctx
    launched = _launched(ctx)
    chosen = backend or _default_backend(torch, ctx)
    if chosen == "nccl":
        torch.cuda.set_device(ctx.local_rank)
    timeout = timedelta(seconds=timeout_s)
    if launched:
        dist.init_process_group(chosen, timeout=timeout)
    else:
        # Port 0: the store binds a free port itself, so there is no probe-then-bind race.
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timeout)
        dist.init_process_group(chosen, store=store, rank=0, world_size=1, timeout=timeout)
    with _lock:
        _shut_down = False
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
    get_shipper().heartbeat()  # tells the gateway this rank got past rendezvous
    return ctx


def shutdown(flush_timeout_s: float = 10.0) -> None:
    """Commit a checkpoint still being saved, flush metrics, then destroy the process group
    without crashing the interpreter.

    Call it at the end of training, after `del model` (and the optimizer) so the
    DDP reducer lets go of the process group: with torch 2.x a plain
    `destroy_process_group()` at exit can abort the process (a gloo thread takes
    the GIL during interpreter shutdown). Runs once; `init()` registers it at exit.

    Example:
        >>> import air_sdk.runtime as air
        >>> del model  # doctest: +SKIP
        >>> air.shutdown()  # doctest: +SKIP
    """
    global _shut_down
    with _lock:
        if _shut_down:
            return
        _shut_down = True
    with keep_alive():  # finishing is work too: never a hang
        checkpoint = sys.modules.get("air_sdk.runtime.checkpoint")
        if checkpoint is not None:  # commit an in-flight save while its group still exists
            checkpoint._finalize_pending()
        get_shipper().flush(flush_timeout_s)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            gc.collect()  # frees a DDP reducer the caller dropped, while the interpreter is whole
            meshes = sys.modules.get("air_sdk.runtime.parallel.meshes")
            if meshes is not None:  # their groups go with the process group
                meshes._forget_meshes()
            dist.destroy_process_group()
        # What is left is the interpreter's own exit (freeing memory, atexit): leaving, not
        # hung, however long that takes on a loaded machine.
        get_shipper().mark_finished()
        get_shipper().flush(flush_timeout_s)


def _shutdown_at_exit() -> None:
    try:
        shutdown()
    except Exception as exc:  # an atexit traceback would hide the real exit status
        print(f"air: shutdown at exit failed: {exc!r}", file=sys.stderr, flush=True)
