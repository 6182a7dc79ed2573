"""Attempt accounting: how much of a job's wall time trained something that was kept.

For each attempt, productive time runs from its first logged step to the point
whose work survived: the attempt's end when it succeeded (or is still running),
else its last committed checkpoint (work after that is redone by the next
attempt). Everything else is lost: launch and rendezvous, loading, work after the
last checkpoint, teardown and backoff. Goodput = productive time / wall time,
wall time running from the first attempt's start to the job's end (or now).

A job that never logs a step (a plain torchrun script, no air.log) has no first step:
its productive time starts when every rank of the attempt was up (RUNNING), and ends
the same way (the end of the attempt that succeeded or still runs, else its last
committed checkpoint; with none, a failed attempt's time was all redone, so all lost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from air_sdk.schema import AttemptRecord


@dataclass(frozen=True)
class AttemptTimes:
    """What the event log says of one attempt's progress."""

    attempt: int
    #: wall time of its first metrics point (None: it never logged a step)
    first_progress_ts: float | None
    #: wall time of its last committed checkpoint
    last_commit_ts: float | None
    #: wall time every rank was up (the attempt's RUNNING state); the start of productive
    #: time for jobs that never log a step
    ranks_up_ts: float | None = None


@dataclass(frozen=True)
class Accounting:
    productive_s: dict[int, float]
    lost_s: dict[int, float]
    wall_s: float

    @property
    def goodput(self) -> float | None:
        if self.wall_s <= 0:
            return None
        return min(1.0, sum(self.productive_s.values()) / self.wall_s)


def account(
    attempts: Sequence[AttemptRecord],
    times: Sequence[AttemptTimes],
    *,
    job_ended_at: float | None,
    now: float,
    succeeded: bool,
) -> Accounting:
    """Productive and lost seconds per attempt, and the job's wall time.

    Example:
        >>> from air_sdk.schema import Placement
        >>> p = Placement(job_id="j", nodes=())
        >>> a = [AttemptRecord(job_id="j", attempt=1, placement=p, started_at=0, ended_at=10)]
        >>> acc = account(a, [AttemptTimes(1, 2.0, None)], job_ended_at=10, now=10, succeeded=True)
        >>> acc.productive_s[1], acc.lost_s[1], acc.goodput
        (8.0, 2.0, 0.8)
    """
    by_attempt = {t.attempt: t for t in times}
    logs_steps = any(t.first_progress_ts is not None for t in times)
    productive: dict[int, float] = {}
    lost: dict[int, float] = {}
    last = attempts[-1].attempt if attempts else None
    for a in attempts:
        end = a.ended_at if a.ended_at is not None else now
        t = by_attempt.get(a.attempt, AttemptTimes(a.attempt, None, None))
        kept_until: float | None
        if a.attempt == last and (succeeded or a.ended_at is None):
            kept_until = end
        else:
            kept_until = t.last_commit_ts
        start = t.first_progress_ts if logs_steps else t.ranks_up_ts
        if start is None or kept_until is None or kept_until <= start:
            productive[a.attempt] = 0.0
        else:
            productive[a.attempt] = min(end, kept_until) - start
        lost[a.attempt] = max(0.0, (end - a.started_at) - productive[a.attempt])
    if not attempts:
        return Accounting({}, {}, 0.0)
    wall = (job_ended_at if job_ended_at is not None else now) - attempts[0].started_at
    return Accounting(productive, lost, max(0.0, wall))
