"""Why a queued job did not start, in words a user can act on.

The walk in `decide` records a `Reason` per waiting job; the words are made when
read, from the capacity left at the end of the cycle ("2 have them" counts the
nodes that still have the room after this cycle's starts).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from air_sdk.scheduler.gang import JobRequest
from air_sdk.text import plural

if TYPE_CHECKING:
    from air_sdk.scheduler.waits import PartitionCycle


_job_id = operator.attrgetter("job_id")


class Reason(Enum):
    NO_FIT = "no fit"
    RESERVED = "reserved"
    BEHIND = "behind"
    HEAD = "head"
    PREEMPTING = "preempting"
    WAITING_EXIT = "waiting for exit"


def need_text(job: JobRequest) -> str:
    """ "needs 4 nodes with 8 free GPUs" (or slots, for CPU jobs).

    Example:
        >>> need_text(JobRequest("j", 4, 8, 8))
        'needs 4 nodes with 8 free GPUs'
    """
    n, s, g = job.nodes, job.slots_per_node, job.gpus_per_node
    nodes = plural(n, "node")
    if g:
        extra = f" and {plural(s, 'slot')}" if s > g else ""
        return f"needs {nodes} with {plural(g, 'free GPU')}{extra}"
    return f"needs {nodes} with {plural(s, 'free slot')}"


def duration_text(seconds: float) -> str:
    """A short human duration.

    Example:
        >>> duration_text(30), duration_text(600), duration_text(7200), duration_text(3 * 86400)
        ('30 s', '10 min', '2.0 h', '3.0 days')
    """
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "at an unknown time"
    return "now" if t <= now else f"in {duration_text(t - now)}"


class Explanations(Mapping[str, str]):
    """{job_id: why it waits}, worded when read.

    The walk gives the sentence of a job that is not in any line (never fits, over
    quota) and, at its end, the partitions' lines: each keeps its waiting jobs in
    order with their reasons, appended in O(1). A sentence is made on first read (and
    kept), from the cycle's state when it ended; a runner that shows only some jobs'
    explanations pays only for those.

    Example:
        >>> e = Explanations({}, now=0.0)
        >>> e.put("j", "no pool named 'tpu'; pools: a100")
        >>> dict(e)
        {'j': "no pool named 'tpu'; pools: a100"}
    """

    def __init__(self, positions: Mapping[str, int], now: float) -> None:
        self._given: dict[str, str] = {}
        self._worded: dict[str, str] = {}
        self._lines: Sequence[PartitionCycle] = ()
        #: waiting job -> its partition; made on first read
        self._where: dict[str, PartitionCycle] | None = None
        self._positions = positions
        self._now = now
        # most waiting jobs share a pool, a shape and a reason: word those parts once
        self._parts: dict[tuple[Reason, int, tuple[int, int, int], bool], tuple[str, str]] = {}
        self._counts: dict[tuple[int, int, int], int] = {}

    def put(self, job_id: str, text: str) -> None:
        self._given[job_id] = text

    def add_lines(self, lines: Sequence[PartitionCycle]) -> None:
        """Explain the jobs in these partitions' lines (`waiting`, with `reasons`);
        `positions` places them."""
        self._lines = lines
        self._where = None

    def _waiting(self) -> dict[str, PartitionCycle]:
        if self._where is None:
            where: dict[str, PartitionCycle] = {}
            for st in self._lines:
                where.update(dict.fromkeys(map(_job_id, st.waiting), st))
            self._where = where
        return self._where

    def __getitem__(self, job_id: str) -> str:
        text = self._given.get(job_id)
        if text is None:
            text = self._worded.get(job_id)
        if text is None:
            st = self._waiting()[job_id]
            ahead = self._positions[job_id] - 1
            text = self._word(st.waiting[ahead], st.reasons[ahead], st, ahead)
            self._worded[job_id] = text
        return text

    def __iter__(self) -> Iterator[str]:
        yield from self._given
        yield from self._waiting()

    def __len__(self) -> int:
        return len(self._given) + len(self._waiting())

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._given or job_id in self._waiting()

    def __repr__(self) -> str:
        return f"Explanations({dict(self)!r})"

    def _word(self, job: JobRequest, reason: Reason, st: PartitionCycle, ahead: int) -> str:
        if reason is Reason.RESERVED:
            ck = (st.part.index, job.slots_per_node, job.gpus_per_node)
            have = self._counts.get(ck)
            if have is None:
                have = st.part.count_free(job.slots_per_node, job.gpus_per_node)
                self._counts[ck] = have
            if have < job.nodes:
                reason = Reason.NO_FIT  # it would not fit even without the reservation
        if reason is Reason.NO_FIT or reason is Reason.RESERVED:
            key = (reason, st.part.index, job.shape, job.est_duration_s is None)
            parts = self._parts.get(key)
            if parts is None:
                parts = self._parts[key] = _split(_text(job, reason, st, 0, self._now))
            return f"{parts[0]}{plural(ahead, 'job')}{parts[1]}"
        return _text(job, reason, st, ahead, self._now)


def _split(text: str) -> tuple[str, str]:
    """The text around "behind 0 jobs", so that only the count is worded per job."""
    marker = "behind 0 jobs"
    i = text.index(marker)
    return text[: i + len("behind ")], text[i + len(marker) :]


def _text(job: JobRequest, reason: Reason, st: PartitionCycle, ahead: int, now: float) -> str:
    p = st.part
    have = p.count_free(job.slots_per_node, job.gpus_per_node)
    fit = f"{need_text(job)} in pool {p.label!r}; {have} {'has' if have == 1 else 'have'} them"
    head = st.head.job_id if st.head is not None else "?"
    behind = f"behind {plural(ahead, 'job')} in pool {p.label!r}"
    if reason is Reason.HEAD:
        if st.res_start is None:
            return f"{fit}; start time unknown (running jobs have no expected end)"
        return f"{fit}; expected to start {_when(st.res_start, now)}"
    if reason is Reason.PREEMPTING:
        return (
            f"{fit}; preempting {plural(len(st.waiting_for), 'lower-priority job')}"
            f" ({', '.join(st.waiting_for)}) to make room"
        )
    if reason is Reason.WAITING_EXIT:
        return (
            f"{fit}; waiting for {plural(len(st.waiting_for), 'preempted job')}"
            f" ({', '.join(st.waiting_for)}) to exit"
        )
    if reason is Reason.RESERVED:
        if job.est_duration_s is None:
            why = "this job has no duration estimate"
        elif st.res_start is None:
            why = f"{head}'s start time is unknown"
        else:
            why = f"this job would still run when {head} is to start ({_when(st.res_start, now)})"
        return (
            f"reserved for job {head} (backfill): the free capacity in pool {p.label!r}"
            f" is held for it and {why}; {behind}"
        )
    if reason is Reason.BEHIND:
        return f"{behind} (first: {head}); backfill is off"
    return f"{behind} (first: {head}); {fit}"
