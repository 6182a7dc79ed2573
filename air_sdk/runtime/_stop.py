"""Graceful stops: a training loop asks `should_stop()` each step and, when the job is
being preempted (SIGTERM from the runner or the machine), saves and leaves with
`exit_stopped()`. The job is then requeued and resumes from that checkpoint.

The SIGTERM handler is installed by the first `should_stop()` call, so a script
that never asks keeps Python's default (SIGTERM ends it at once).
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any, NoReturn

__all__ = ["SIGTERM_EXIT", "exit_stopped", "should_stop"]

#: the exit code of a rank that stopped on request (128 + SIGTERM, as a shell reports
#: a process killed by SIGTERM): the runner reads it as a preemption, not a failure
SIGTERM_EXIT = 128 + signal.SIGTERM

_requested = threading.Event()
_installed = False
_lock = threading.Lock()


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    _requested.set()


def _install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "call air.should_stop() first from the main thread: only it can install"
                " the SIGTERM handler"
            )
        signal.signal(signal.SIGTERM, _on_sigterm)
        _installed = True


def _agree(local: bool) -> bool:
    """True if any rank was asked to stop (a collective: every rank must call it at the
    same step, like any other collective)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    device: Any = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def should_stop() -> bool:
    """True once this job is asked to stop (SIGTERM reached any rank: the scheduler
    preempts it for a higher-priority job, or the machine is being reclaimed).

    Call it at the same point of every step on every rank (it agrees across ranks
    with one tiny all_reduce, so all ranks save the same step). On True: save a
    checkpoint and call `exit_stopped()`. The runner gives the job
    `failure.preemption_grace_s` (default 30 s) between SIGTERM and SIGKILL.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.should_stop()
        False
    """
    _install()
    return _agree(_requested.is_set())


def exit_stopped() -> NoReturn:
    """Leave after a graceful stop: wait for checkpoint saves in flight and logs to be
    sent, then exit with SIGTERM_EXIT (143). The runner counts the attempt as
    preempted: the job is requeued and not charged to its restart budget.

    Example:
        >>> import air_sdk.runtime as air
        >>> if air.should_stop():  # doctest: +SKIP
        ...     air.checkpoint.save(state, step=step)
        ...     air.exit_stopped()
    """
    from air_sdk.runtime._dist import shutdown

    shutdown()
    sys.exit(SIGTERM_EXIT)
