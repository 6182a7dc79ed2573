"""How the CLI draws jobs: tables, status, failures and the live progress line.

Pure functions of schema objects (`JobRecord`, `JobSnapshot`, `MetricRow`) to
rich renderables, plus `ProgressView`, which redraws at most 4 times a second.

Examples marked `+SKIP` follow a job on a running gateway.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from air_sdk.schema.api import JobRecord, MetricRow
from air_sdk.schema.snapshot import DERIVED_METRICS, JobSnapshot, loss_name, metric_order
from air_sdk.schema.state import JobState

if TYPE_CHECKING:
    from air_sdk.client.job import Job

__all__ = [
    "ProgressView",
    "failure_lines",
    "follow_to_end",
    "format_age",
    "jobs_table",
    "metrics_table",
    "progress_line",
    "state_badge",
    "status_text",
    "summary_table",
    "watch",
]

#: at most this many redraws a second (a terminal is not a video player)
MAX_REDRAWS_PER_S = 4
#: lines of a failing rank's log shown with a failure
FAILURE_TAIL_LINES = 20
#: metrics shown beside the step in the progress line
MAX_SHOWN_METRICS = 4

_STATE_STYLE = {
    JobState.QUEUED: "black on grey70",
    JobState.SCHEDULED: "black on cyan",
    JobState.STARTING: "black on cyan",
    JobState.RUNNING: "black on green",
    JobState.RESTARTING: "black on yellow",
    JobState.SUCCEEDED: "bold white on green4",
    JobState.FAILED: "bold white on red",
    JobState.CANCELLED: "black on grey50",
}


def state_badge(state: JobState) -> Text:
    """The state as a coloured badge.

    Example:
        >>> state_badge(JobState.RUNNING).plain
        ' RUNNING '
    """
    return Text(f" {state.value} ", style=_STATE_STYLE.get(state, ""))


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


def _fmt(value: float) -> str:
    # Throughputs read better as 74740 than 7.474e+04; losses keep 4 significant digits.
    if 1e3 <= abs(value) < 1e9:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _ordered_metrics(latest: dict[str, float]) -> list[tuple[str, float]]:
    # Loss first (what people watch), then the rest by name.
    return sorted(latest.items(), key=lambda item: metric_order(item[0]))


def jobs_table(records: Sequence[JobRecord], *, now: float | None = None) -> Table:
    """`air jobs`: id, name, state, nodes x procs, attempt, age."""
    now = time.time() if now is None else now
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "NAME", "STATE", "NODES x PROCS", "ATTEMPT", "AGE"):
        table.add_column(column, no_wrap=True)
    for record in records:
        resources = record.spec.resources
        table.add_row(
            record.id,
            record.name,
            state_badge(record.state),
            f"{resources.nodes} x {resources.ranks_per_node}",
            str(record.attempt),
            format_age(now - record.created_at),
        )
    return table


def failure_lines(record: JobRecord, snapshot: JobSnapshot | None = None) -> list[Text]:
    """What failed: the first failing rank, how it ended, and its last log lines.

    Example:
        >>> from air_sdk.schema import FailureInfo, JobSpec
        >>> record = JobRecord(
        ...     id="j-1", tenant="t", name="demo", state=JobState.FAILED, created_at=0,
        ...     updated_at=0, spec=JobSpec(entrypoint="train.py"),
        ...     failure=FailureInfo(attempt=1, reason="worker crashed", rank=1, exit_code=3),
        ... )
        >>> failure_lines(record)[0].plain
        'failed: rank 1 exit code 3 (attempt 1): worker crashed'
    """
    lines: list[Text] = []
    failure = record.failure
    tail: list[str] = []
    if failure is not None:
        if failure.rank is not None:
            how = f"signal {failure.signal}" if failure.signal else f"exit code {failure.exit_code}"
            where = f"rank {failure.rank} {how} (attempt {failure.attempt})"
        else:
            where = f"attempt {failure.attempt}"
        reason = f": {failure.reason}" if failure.reason else ""
        lines.append(Text(f"failed: {where}{reason}", style="bold red"))
        tail = list(failure.log_tail)
        if not tail and failure.rank is not None and snapshot is not None:
            tail = snapshot.log_tail.get(failure.rank, [])
    elif snapshot is not None:
        bad = [e for e in snapshot.rank_exits if not e.ok]
        if bad:
            lines.append(Text(f"failed: {bad[0].describe()}", style="bold red"))
            tail = list(bad[0].tail) or snapshot.log_tail.get(bad[0].rank, [])
    if not lines:
        lines.append(
            Text(f"failed: {record.state_reason or 'no reason recorded'}", style="bold red")
        )
    if tail:
        lines.append(Text("last log lines:", style="dim"))
        lines.extend(Text(f"  {line}") for line in tail[-FAILURE_TAIL_LINES:])
    return lines


def status_text(record: JobRecord, snapshot: JobSnapshot | None) -> Group:
    """`air status`: state, reason, attempts, step and metrics, and any failure."""
    resources = record.spec.resources
    head = Text.assemble(
        (record.id, "bold"),
        f"  {record.name}  ",
        state_badge(record.state),
        f"  {resources.nodes} x {resources.ranks_per_node} ranks",
    )
    parts: list[RenderableType] = [head]
    if record.state_reason:
        parts.append(Text(f"reason: {record.state_reason}"))
    restarts = f" ({record.num_restarts} restarts)" if record.num_restarts else ""
    parts.append(Text(f"attempt: {record.attempt}{restarts}"))
    if record.state is JobState.QUEUED:
        if record.queue_position is not None:
            parts.append(Text(f"queue position: {record.queue_position}"))
        if record.queue_reason:
            parts.append(Text(f"waiting: {record.queue_reason}"))
    if snapshot is not None and snapshot.step is not None:
        parts.append(Text(progress_metrics(snapshot)))
    if record.cancel_requested and not record.state.terminal:
        parts.append(Text("cancel requested", style="yellow"))
    if record.state is JobState.FAILED:
        parts.extend(failure_lines(record, snapshot))
    return Group(*parts)


def progress_metrics(snapshot: JobSnapshot) -> str:
    """Step, latest metrics, rate, tokens/s and MFU, e.g.
    `step 120  loss 0.031  45.1 steps/s  1.23M tokens/s  MFU 41.2%` ("" before any)."""
    if snapshot.step is None:
        return ""
    pieces = [f"step {snapshot.step}"]
    logged = {k: v for k, v in snapshot.latest.items() if k not in DERIVED_METRICS}
    for name, value in _ordered_metrics(logged)[:MAX_SHOWN_METRICS]:
        pieces.append(f"{name} {_fmt(value)}")
    rate = snapshot.steps_per_second
    if rate is not None:
        pieces.append(f"{rate:.1f} steps/s")
    if snapshot.tokens_per_s is not None:
        pieces.append(f"{_si(snapshot.tokens_per_s)} tokens/s")
    if snapshot.mfu is not None:
        pieces.append(f"MFU {snapshot.mfu:.1%}")
    return "  ".join(pieces)


def _si(value: float) -> str:
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def progress_line(snapshot: JobSnapshot, *, elapsed_s: float | None = None) -> Text:
    """The live line: badge, attempt, step, latest metrics, steps/s, elapsed.

    Example:
        >>> progress_line(JobSnapshot(job_id="j")).plain
        ' QUEUED   j'
    """
    text = Text.assemble(state_badge(snapshot.state), "  ", (snapshot.job_id, "bold"))
    if snapshot.attempt:
        restarts = f", {snapshot.num_restarts} restarts" if snapshot.num_restarts else ""
        text.append(f"  attempt {snapshot.attempt}{restarts}")
    metrics = progress_metrics(snapshot)
    if metrics:
        text.append(f"  {metrics}")
    if elapsed_s is not None:
        text.append(f"  {format_age(elapsed_s)}", style="dim")
    return text


def metrics_table(rows: Iterable[MetricRow]) -> Table:
    """`air metrics`: one row per logged point, one column per metric name."""
    rows = list(rows)
    names = sorted({name for row in rows for name in row.values}, key=metric_order)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("STEP", "RANK", "ATTEMPT", *names):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        values = [_fmt(row.values[n]) if n in row.values else "" for n in names]
        table.add_row(str(row.step), str(row.rank), str(row.attempt), *values)
    return table


def summary_table(record: JobRecord, snapshot: JobSnapshot) -> Table:
    """The end-of-run summary: final state, attempts, steps, final loss, steps/s."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    table.add_row("job", f"{record.id} ({record.name})")
    table.add_row("final state", state_badge(record.state))
    restarts = f" ({record.num_restarts} restarts)" if record.num_restarts else ""
    table.add_row("attempts", f"{record.attempt}{restarts}")
    table.add_row("steps", "-" if snapshot.step is None else str(snapshot.step))
    name = loss_name(snapshot.latest)
    loss = None if name is None else snapshot.latest[name]
    table.add_row("final loss", "-" if loss is None else _fmt(loss))
    rate = snapshot.steps_per_second
    table.add_row("steps/second", "-" if rate is None else f"{rate:.1f}")
    if snapshot.tokens_per_s is not None:
        table.add_row("tokens/second", _si(snapshot.tokens_per_s))
    if snapshot.mfu is not None:
        table.add_row("MFU", f"{snapshot.mfu:.1%}")
    if record.started_at is not None and record.ended_at is not None:
        table.add_row("wall time", f"{record.ended_at - record.started_at:.1f} s")
    return table


class ProgressView:
    """A live progress line for a followed job: redrawn in place on a terminal
    (at most `MAX_REDRAWS_PER_S`), one line per state change elsewhere (CI, pipes).

    Example:
        >>> with ProgressView(console) as view:  # doctest: +SKIP
        ...     for event in job.follow():
        ...         snap.apply(event)
        ...         view.update(snap)
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live: Live | None = None
        self._last_draw = 0.0
        self._started = time.monotonic()
        self._last_key: tuple[JobState, int] | None = None
        self._last_plain = ""
        self._snapshot: JobSnapshot | None = None

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            live = Live(console=self.console, auto_refresh=False, transient=False)
            live.start()
            self._live = live
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._snapshot is not None:
            self.update(self._snapshot, force=True)
        if self._live is not None:
            self._live.stop()

    def update(self, snapshot: JobSnapshot, *, force: bool = False) -> None:
        self._snapshot = snapshot
        if self._live is None:
            # Not a terminal (CI, a pipe): a line per state or attempt change, and the
            # final line when it says more than the last one printed.
            key = (snapshot.state, snapshot.attempt)
            line = progress_line(snapshot)
            if key != self._last_key or (force and line.plain != self._last_plain):
                self._last_key, self._last_plain = key, line.plain
                self.console.print(line, soft_wrap=True)
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 1.0 / MAX_REDRAWS_PER_S:
            return
        self._last_draw = now
        line = progress_line(snapshot, elapsed_s=now - self._started)
        self._live.update(line, refresh=True)


def watch(job: Job, console: Console) -> tuple[JobSnapshot, JobRecord]:
    """Follow `job` to its end with a `ProgressView`; return the final snapshot and record.

    Example:
        >>> snapshot, record = watch(client.job("j-3f2a"), console)  # doctest: +SKIP
    """
    snapshot = JobSnapshot(job_id=job.id)
    with ProgressView(console) as view:
        view.update(snapshot)
        for event in job.follow(after=0):
            snapshot.apply(event)
            view.update(snapshot)
    return snapshot, job.record()


def follow_to_end(job: Job, console: Console) -> int:
    """Live progress until the job ends, then the summary (and the failure, if any).

    Returns the exit code for the command: 0 when the job SUCCEEDED, else 1.
    KeyboardInterrupt passes through (the caller says how to reattach).

    Example:
        >>> raise SystemExit(follow_to_end(job, console))  # doctest: +SKIP
    """
    snapshot, record = watch(job, console)
    console.print(summary_table(record, snapshot))
    if record.state is JobState.SUCCEEDED:
        return 0
    if record.state is JobState.FAILED:
        for line in failure_lines(record, snapshot):
            console.print(line, soft_wrap=True)
    else:
        console.print(f"{record.state.value.lower()}: {record.state_reason or 'no reason given'}")
    return 1
