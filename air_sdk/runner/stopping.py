"""Stopping an attempt gracefully without letting the job hold its own cancel.

A preempted job gets SIGTERM and its preemption grace to save a checkpoint. A job
that ignores SIGTERM would keep its nodes, and a user's `air cancel`, for all of that
grace: here a cancel that comes during the grace kills the ranks `CANCEL_OVERRIDE_S`
after it came, whatever the grace.

Example:
    >>> stop_unless_cancelled(backend, handle, 120.0, lambda: False)  # doctest: +SKIP
    False
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from air_sdk.runner.backends.base import AttemptHandle, Backend

__all__ = ["CANCEL_OVERRIDE_S", "stop_unless_cancelled"]

log = logging.getLogger(__name__)

#: how long a job in its grace may still take after a cancel before its ranks are killed
CANCEL_OVERRIDE_S = 10.0
#: how often the cancel flag is read during the grace
POLL_S = 0.2


def stop_unless_cancelled(
    backend: Backend,
    handle: AttemptHandle,
    grace_s: float,
    cancelled: Callable[[], bool],
    *,
    override_s: float = CANCEL_OVERRIDE_S,
) -> bool:
    """Stop the attempt with `grace_s` (SIGTERM, SIGKILL after it); once `cancelled()`
    turns true, the ranks get `override_s` more, then SIGKILL. Returns when nothing of
    the attempt is left: whether it was cancelled meanwhile."""
    graceful = threading.Thread(
        target=backend.terminate, args=(handle, grace_s), name="air-graceful-stop", daemon=True
    )
    graceful.start()
    cancelled_at: float | None = None
    while graceful.is_alive():
        graceful.join(POLL_S)
        if cancelled_at is None and cancelled():
            cancelled_at = time.monotonic()
        if cancelled_at is not None and time.monotonic() - cancelled_at >= override_s:
            log.info("cancelled during a preemption grace of %g s: killing the ranks", grace_s)
            backend.terminate(handle, 0.0)
            graceful.join()
    return cancelled_at is not None or cancelled()
