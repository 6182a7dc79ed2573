"""Waiting, before a failed attempt's teardown, for the surviving ranks that write a
checkpoint at the failure (`air_sdk.runtime._failure_save`).

Ranks that can write one leave `failure-saves/armed-rank-R`: then every rank still
running gets `FAILURE_SAVE_NOTICE_S` to notice the failure (its next collective fails)
and exit, start saving (`failure-saves/rank-R`) or say it is past that
(`failure-saves/done-rank-R`); saves get `FAILURE_SAVE_WAIT_S` in all. Without an armed
rank nothing waits.

Example:
    >>> marked({"armed-rank-0", "rank-1", "done-rank-2"}, "rank-")
    {1}
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from air_sdk.runner.backends.base import AttemptHandle, Backend

__all__ = ["FAILURE_SAVE_NOTICE_S", "FAILURE_SAVE_WAIT_S", "marked", "wait_for_failure_saves"]

log = logging.getLogger(__name__)

#: how long a failed attempt's teardown waits for surviving ranks that are writing a
#: checkpoint at the failure
FAILURE_SAVE_WAIT_S = 30.0
#: ... and, where ranks can write one, how long it waits for the rest to notice the
#: failure (their next collective fails) before it stops them
FAILURE_SAVE_NOTICE_S = 2.0


def marked(names: set[str], prefix: str) -> set[int]:
    """The ranks R with a file `<prefix>R` among `names`."""
    n = len(prefix)
    return {int(m[n:]) for m in names if m.startswith(prefix) and m[n:].isdigit()}


def wait_for_failure_saves(
    backend: Backend,
    handle: AttemptHandle,
    world_size: int,
    exited: Callable[[], set[int]],
    job_id: str,
) -> None:
    """Return once no surviving rank of `handle` is (or may start) writing its
    checkpoint at the failure; `exited()`: the ranks whose exits are recorded."""
    if not marked(backend.failure_marks(handle), "armed-rank-"):
        return
    start = time.monotonic()
    while time.monotonic() - start < FAILURE_SAVE_WAIT_S:
        marks = backend.failure_marks(handle)
        decided = exited() | marked(marks, "done-rank-")
        saving = marked(marks, "rank-") - decided
        undecided = world_size - len(decided) - len(saving)
        if not saving and (undecided <= 0 or time.monotonic() - start >= FAILURE_SAVE_NOTICE_S):
            return
        time.sleep(0.02)
    log.warning("job %s: a checkpoint at the failure took over %.0f s", job_id, FAILURE_SAVE_WAIT_S)
