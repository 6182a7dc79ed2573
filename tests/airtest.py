"""Helpers shared by the tests (on sys.path through pytest's `pythonpath`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from air_sdk.runner.backends.local import job_processes


def wait_for(
    predicate: Callable[[], object], timeout_s: float = 60, what: str = "condition"
) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def no_processes_left(job_id: str) -> bool:
    return not job_processes(job_id)
