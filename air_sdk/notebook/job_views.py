"""What the `%air` line magics show: a jobs table (HTML in a notebook, text
elsewhere), one job's status, a gateway's status. Pure text from schema objects,
except `gateway_status_text`, which asks the gateway.

Example:
    >>> JobsTable([])
    no jobs
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from air_sdk.errors import AirError, TransportError
from air_sdk.text import plural

if TYPE_CHECKING:
    from air_sdk.client import Client
    from air_sdk.schema.api import JobRecord
    from air_sdk.schema.events import FailureInfo

__all__ = ["JobsTable", "failure_text", "format_age", "gateway_status_text", "job_status_text"]


def failure_text(failure: FailureInfo) -> str:
    """The failing rank, how it ended and why, each said once (a runner's reason often
    is already "rank 0 exit code 1").

    Example:
        >>> from air_sdk.schema import FailureInfo
        >>> failure_text(FailureInfo(attempt=1, reason="rank 0 exit code 1", rank=0, exit_code=1))
        'rank 0 exit code 1'
        >>> failure_text(FailureInfo(attempt=1, reason="worker crashed", rank=1, signal="SIGKILL"))
        'rank 1 killed by signal SIGKILL: worker crashed'
    """
    where = ""
    if failure.rank is not None and (failure.signal or failure.exit_code is not None):
        how = (
            f"killed by signal {failure.signal}"
            if failure.signal
            else f"exit code {failure.exit_code}"
        )
        where = f"rank {failure.rank} {how}"
    reason = failure.reason or ""
    if where and reason.startswith(where):
        return reason
    return ": ".join(part for part in (where, reason) if part) or "no reason recorded"


def format_age(seconds: float) -> str:
    """A short duration: 42s, 3m, 5h, 2d.

    Example:
        >>> format_age(125)
        '2m'
    """
    seconds = max(seconds, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def job_status_text(record: JobRecord) -> str:
    """State, size, attempt and (for a failure) which rank failed, how, and its last lines.

    Example:
        >>> from air_sdk.schema import JobRecord, JobSpec, JobState
        >>> record = JobRecord(id="cell-5d41402a", tenant="t", name="cell", state=JobState.QUEUED,
        ...                    spec=JobSpec(code="pass", resources={"nodes": 2}),
        ...                    created_at=0, updated_at=0)
        >>> print(job_status_text(record))
        job cell-5d41402a (cell): QUEUED
          2 nodes x 1 rank; attempt 0, 0 restarts
    """
    resources = record.spec.resources
    lines = [
        f"job {record.id} ({record.name}): {record.state.value}"
        + (f" - {record.state_reason}" if record.state_reason else ""),
        f"  {plural(resources.nodes, 'node')} x {plural(resources.ranks_per_node, 'rank')};"
        f" attempt {record.attempt}, {plural(record.num_restarts, 'restart')}",
    ]
    failure = record.failure
    if failure is not None:
        lines.append(f"  failed (attempt {failure.attempt}): {failure_text(failure)}")
        lines.extend(f"    {text}" for text in failure.log_tail[-10:])
    return "\n".join(lines)


def gateway_status_text(client: Client, pid: int | None) -> str:
    """Is the gateway up: its URL, version, pid and nodes (one try, no retries wanted).

    Example:
        >>> print(gateway_status_text(Client(max_attempts=1), None))  # doctest: +SKIP
        gateway http://127.0.0.1:8470 is up (version 0.1.0)
          node-0: 0/1 slots
    """
    try:
        health = client.health()
    except TransportError:
        return f"no gateway at {client.gateway_url}; start one with %air gateway start"
    lines = [
        f"gateway {client.gateway_url} is up (version {health.version}"
        + (f", pid {pid})" if pid else ")")
    ]
    try:
        inventory = client.inventory()
    except AirError as exc:
        lines.append(f"  cannot list nodes: {exc}")
        return "\n".join(lines)
    for node in inventory.nodes:
        gpus = f", {plural(len(node.gpus), 'GPU')}" if node.gpus else ""
        jobs = f"  jobs: {', '.join(node.jobs)}" if node.jobs else ""
        health_note = "" if node.healthy else " (unhealthy)"
        lines.append(
            f"  {node.name}: {node.used_slots}/{plural(node.slots, 'slot')}{gpus}{health_note}{jobs}"
        )
    return "\n".join(lines)


class JobsTable:
    """`%air jobs`: an HTML table in the notebook, plain text elsewhere.

    Example:
        >>> from air_sdk.schema import JobRecord, JobSpec, JobState
        >>> record = JobRecord(id="cell-5d41402a", tenant="t", name="cell", state=JobState.QUEUED,
        ...                    spec=JobSpec(code="pass", resources={"nodes": 2}),
        ...                    created_at=0, updated_at=0)
        >>> print(repr(JobsTable([record], now=75)))
        ID             NAME  STATE   NODES x PROCS  ATTEMPT  AGE
        cell-5d41402a  cell  QUEUED  2 x 1          0        1m
    """

    COLUMNS = ("ID", "NAME", "STATE", "NODES x PROCS", "ATTEMPT", "AGE")

    def __init__(self, records: Sequence[JobRecord], *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.rows = [
            (
                r.id,
                r.name,
                r.state.value,
                f"{r.spec.resources.nodes} x {r.spec.resources.ranks_per_node}",
                str(r.attempt),
                format_age(now - r.created_at),
            )
            for r in records
        ]

    def __repr__(self) -> str:
        if not self.rows:
            return "no jobs"
        widths = [max(len(row[i]) for row in [self.COLUMNS, *self.rows]) for i in range(6)]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [self.COLUMNS, *self.rows]
        )

    def _repr_html_(self) -> str:
        if not self.rows:
            return "<p>no jobs</p>"
        head = "".join(f"<th>{c}</th>" for c in self.COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in self.rows
        )
        return (
            f'<table class="air-jobs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        )
