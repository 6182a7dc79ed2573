"""Job states and the transitions between them (the architecture's state machine)."""

from __future__ import annotations

from enum import Enum
from typing import Any


class JobState(str, Enum):
    """QUEUED -> SCHEDULED -> STARTING -> RUNNING -> (RESTARTING -> STARTING ...)
    -> SUCCEEDED | FAILED | CANCELLED. A terminal state is final.

    `str()` and f-strings give the value, as users print it: `print(record.state)`
    shows `SUCCEEDED`; so does a notebook cell whose value is a state.

    Example:
        >>> JobState.SUCCEEDED.terminal
        True
        >>> print(JobState.SUCCEEDED)
        SUCCEEDED
        >>> f"{JobState.FAILED:<9}|"
        'FAILED   |'
    """

    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    def can_go_to(self, nxt: JobState) -> bool:
        return nxt in ALLOWED_TRANSITIONS[self]


def show_value(self: Enum, printer: Any, cycle: bool) -> None:
    """IPython's display of a cell whose value is a state: `SUCCEEDED`, not
    `<JobState.SUCCEEDED: 'SUCCEEDED'>` (set after the class: Enum reserves `_x_` names)."""
    printer.text(self.value)


JobState._repr_pretty_ = show_value  # type: ignore[attr-defined]

TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

_END = {JobState.FAILED, JobState.CANCELLED}
ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.SCHEDULED} | _END),
    JobState.SCHEDULED: frozenset({JobState.STARTING, JobState.QUEUED} | _END),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.RESTARTING, JobState.SUCCEEDED} | _END
    ),
    JobState.RUNNING: frozenset({JobState.RESTARTING, JobState.SUCCEEDED} | _END),
    # RESTARTING -> QUEUED when the job must wait for capacity again.
    JobState.RESTARTING: frozenset({JobState.STARTING, JobState.QUEUED} | _END),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class InvalidTransitionError(ValueError):
    """A state change the state machine does not allow (a bug, never user input)."""


def check_transition(prev: JobState, nxt: JobState) -> None:
    if not prev.can_go_to(nxt):
        raise InvalidTransitionError(f"job state {prev.value} cannot go to {nxt.value}")
