"""How the CLI draws jobs: tables, status, failures and the live progress line.

Pure functions of schema objects (`JobRecord`, `JobSnapshot`, `MetricRow`) to
rich renderables, plus `ProgressView`, which redraws at most 4 times a second.

Examples marked `+SKIP` follow a job on a running gateway.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from air_sdk.cli.act_on import goodput_text, hang_lines
from air_sdk.schema.api import JobRecord, MetricRow
from air_sdk.schema.events import EventType, LogBatch
from air_sdk.schema.numbers import format_value
from air_sdk.schema.snapshot import (
    DERIVED_METRICS,
    TOTAL_STEPS_METRIC,
    JobSnapshot,
    loss_name,
    metric_order,
)
from air_sdk.schema.state import JobState
from air_sdk.text import plural, user_traceback

if TYPE_CHECKING:
    from air_sdk.client.job import Job

__all__ = [
    "STATE_WIDTH",
    "LogRanks",
    "ProgressView",
    "attempt_text",
    "exit_code_of",
    "failure_lines",
    "follow_to_end",
    "format_age",
    "jobs_table",
    "metrics_table",
    "outcome_line",
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


#: the longest state name (RESTARTING): line-by-line output pads states to it
STATE_WIDTH = max(len(s.value) for s in JobState)


def state_badge(state: JobState, *, width: int = 0) -> Text:
    """The state as a coloured badge, padded after its name to `width` (no padding
    before it, so it lines up with the column it sits in).

    Example:
        >>> state_badge(JobState.RUNNING).plain
        'RUNNING'
        >>> state_badge(JobState.QUEUED, width=STATE_WIDTH).plain
        'QUEUED    '
    """
    badge = Text(state.value, style=_STATE_STYLE.get(state, ""))
    badge.pad_right(max(width - len(state.value), 0))
    return badge


def attempt_text(attempt: int, num_restarts: int = 0) -> str:
    """ "attempt 2 (1 restart)"; "" for a first attempt without restarts (nothing to say).

    Example:
        >>> attempt_text(1), attempt_text(3, 2)
        ('', 'attempt 3 (2 restarts)')
    """
    if attempt <= 1 and not num_restarts:
        return ""
    restarts = f" ({plural(num_restarts, 'restart')})" if num_restarts else ""
    return f"attempt {attempt}{restarts}"


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
    return format_value(value)  # a diverging loss shows as "nan" or "inf"


def _ordered_metrics(latest: dict[str, float]) -> list[tuple[str, float]]:
    # Loss first (what people watch), then the rest by name.
    return sorted(latest.items(), key=lambda item: metric_order(item[0]))


def jobs_table(records: Sequence[JobRecord], *, now: float | None = None) -> Table:
    """`air jobs`: id, name, state, nodes x procs, attempt, age."""
    now = time.time() if now is None else now
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "NAME", "STATE", "NODES x PROCS", "ATTEMPT", "AGE"):
        # numbers to the right (the last column then ends without trailing blanks)
        right = column in ("ATTEMPT", "AGE")
        table.add_column(column, no_wrap=True, justify="right" if right else "left")
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


def failure_lines(
    record: JobRecord, snapshot: JobSnapshot | None = None, *, shown_ranks: Iterable[int] = ()
) -> list[Text]:
    """What failed: the first failing rank, how it ended, and its last log lines (unless
    its output was printed already: `shown_ranks`, as `--follow` prints them).

    Example:
        >>> from air_sdk.schema import FailureInfo, JobSpec
        >>> record = JobRecord(
        ...     id="demo-3f2a9c1e", tenant="t", name="demo", state=JobState.FAILED, created_at=0,
        ...     updated_at=0, spec=JobSpec(entrypoint="train.py"),
        ...     failure=FailureInfo(attempt=1, reason="worker crashed", rank=1, exit_code=3),
        ... )
        >>> failure_lines(record)[0].plain
        'failed: rank 1 exit code 3: worker crashed'
        >>> failure_lines(record.model_copy(update={"failure": FailureInfo(
        ...     attempt=2, reason="rank 1 exit code 3", rank=1, exit_code=3)}))[0].plain
        'failed: rank 1 exit code 3 (attempt 2)'
    """
    lines: list[Text] = []
    failure = record.failure
    tail: list[str] = []
    failing_rank: int | None = None
    if failure is not None:
        failing_rank = failure.rank
        where = ""
        if failure.rank is not None and (failure.signal or failure.exit_code is not None):
            how = (
                f"killed by {failure.signal}"
                if failure.signal
                else f"exit code {failure.exit_code}"
            )
            where = f"rank {failure.rank} {how}"
        reason = failure.reason or ""
        if where and reason.startswith(where):  # the runner's reason already says it
            where, reason = reason, ""
        if failure.attempt > 1:
            where = (
                f"{where} (attempt {failure.attempt})" if where else f"attempt {failure.attempt}"
            )
        text = ": ".join(part for part in (where, reason) if part) or "no reason recorded"
        lines.append(Text(f"failed: {text}", style="bold red"))
        lines.extend(Text(f"  {line}") for line in hang_lines(failure))
        tail = list(failure.log_tail)
        if not tail and failure.rank is not None and snapshot is not None:
            tail = snapshot.log_tail.get(failure.rank, [])
    elif snapshot is not None:
        bad = [e for e in snapshot.rank_exits if not e.ok]
        if bad:
            lines.append(Text(f"failed: {bad[0].describe()}", style="bold red"))
            failing_rank = bad[0].rank
            tail = list(bad[0].tail) or snapshot.log_tail.get(bad[0].rank, [])
    if not lines:
        lines.append(
            Text(f"failed: {record.state_reason or 'no reason recorded'}", style="bold red")
        )
    if tail and failing_rank is not None and failing_rank in set(shown_ranks):
        lines.append(Text(f"(rank {failing_rank}'s last lines are above)", style="dim"))
    elif tail:
        lines.append(Text("last log lines:", style="dim"))
        shown = user_traceback(tail, record.id)[-FAILURE_TAIL_LINES:]
        lines.extend(Text(f"  {line}") for line in shown)
    return lines


def status_text(record: JobRecord, snapshot: JobSnapshot | None) -> Group:
    """`air status`: state, reason, attempts, step and metrics, data loading, and any
    failure."""
    resources = record.spec.resources
    head = Text.assemble(
        (record.id, "bold"),
        f"  {record.name}  ",
        state_badge(record.state),
        f"  {plural(resources.nodes, 'node')} x {plural(resources.ranks_per_node, 'rank')}",
    )
    parts: list[RenderableType] = [head]
    if record.state_reason:
        parts.append(Text(f"reason: {record.state_reason}"))
    restarts = f" ({plural(record.num_restarts, 'restart')})" if record.num_restarts else ""
    parts.append(Text(f"attempt: {record.attempt}{restarts}"))
    if record.state is JobState.QUEUED:
        if record.queue_position is not None:
            parts.append(Text(f"queue position: {record.queue_position}"))
        if record.queue_reason:
            parts.append(Text(f"waiting: {record.queue_reason}"))
    if snapshot is not None and snapshot.step is not None:
        parts.append(Text(progress_metrics(snapshot)))
    data = snapshot.data_summary if snapshot is not None else None
    if data is not None and data.describe():
        parts.append(Text(f"data: {data.describe()}"))
    if record.goodput is not None:
        parts.append(Text(goodput_text(record)))
    if snapshot is not None:
        parts.extend(Text(e.describe()) for e in snapshot.exports.values())
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
    total = snapshot.total_steps
    pieces = [f"step {snapshot.steps_done}" + (f"/{total}" if total else "")]
    logged = {
        k: v
        for k, v in snapshot.latest.items()
        if k not in DERIVED_METRICS and k != TOTAL_STEPS_METRIC  # the total is shown above
    }
    for name, value in _ordered_metrics(logged)[:MAX_SHOWN_METRICS]:
        pieces.append(f"{name} {_fmt(value)}")
    rate = snapshot.steps_per_second
    if rate is not None:
        pieces.append(f"{rate:.1f} steps/s")
    if snapshot.tokens_per_s is not None:
        pieces.append(f"{_si(snapshot.tokens_per_s)} tokens/s")
    if snapshot.mfu is not None:
        pieces.append(f"MFU {format_value(snapshot.mfu, '.1%')}")
    return "  ".join(pieces)


def _si(value: float) -> str:
    if not math.isfinite(value):
        return format_value(value)
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def progress_line(snapshot: JobSnapshot, *, elapsed_s: float | None = None) -> Text:
    """The live line: state, job, attempt (from the second on), step, latest metrics,
    steps/s, elapsed. States are padded to one width, so lines printed one after the
    other line up.

    Example:
        >>> progress_line(JobSnapshot(job_id="train-5d41402a")).plain
        'QUEUED      train-5d41402a'
    """
    text = Text.assemble(
        state_badge(snapshot.state, width=STATE_WIDTH), "  ", (snapshot.job_id, "bold")
    )
    attempt = attempt_text(snapshot.attempt, snapshot.num_restarts)
    if attempt:
        text.append(f"  {attempt}")
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


def outcome_line(record: JobRecord) -> str:
    """What is known of an ended job without its metrics: how long it ran, how many
    ranks, how it ended, its goodput. A plain script's summary (no air.log steps).

    Example:
        >>> from air_sdk.schema import JobSpec, Resources
        >>> rec = JobRecord(id="j", tenant="t", name="n", created_at=0, updated_at=0,
        ...     state=JobState.SUCCEEDED, attempt=1, started_at=10.0, ended_at=52.4,
        ...     goodput=0.97, spec=JobSpec(entrypoint="t.py", resources=Resources(nodes=2)))
        >>> outcome_line(rec)
        'ran 42 s, 2 ranks, exit 0, goodput 97%'
    """
    pieces = []
    if record.started_at is not None and record.ended_at is not None:
        pieces.append(f"ran {record.ended_at - record.started_at:.0f} s")
    pieces.append(plural(record.spec.resources.world_size, "rank"))
    failure = record.failure
    if record.state is JobState.SUCCEEDED:
        pieces.append("exit 0")
    elif failure is not None and failure.kind == "hang":
        pieces.append("hung")
    elif failure is not None and failure.signal:
        pieces.append(f"killed by {failure.signal}")
    elif failure is not None and failure.exit_code is not None:
        pieces.append(f"exit {failure.exit_code}")
    else:
        pieces.append(record.state.value.lower())
    if record.goodput is not None:
        pieces.append(goodput_text(record))
    return ", ".join(pieces)


def summary_table(record: JobRecord, snapshot: JobSnapshot) -> Group:
    """The end-of-run summary: final state, attempts, steps, final loss, steps/s (what
    the job logged; a script that logs no steps gets `outcome_line` instead), goodput;
    one line per row, values in one column, no trailing blanks.

    Example:
        >>> from air_sdk.schema import JobSpec
        >>> rec = JobRecord(id="train-5d41402a", tenant="t", name="train", created_at=0,
        ...     updated_at=0, state=JobState.SUCCEEDED, attempt=1, spec=JobSpec(entrypoint="t.py"))
        >>> for line in summary_table(rec, JobSnapshot(job_id=rec.id)).renderables[:3]:
        ...     print(line.plain)
        job          train-5d41402a (train)
        final state  SUCCEEDED
        attempts     1
    """
    restarts = f" ({plural(record.num_restarts, 'restart')})" if record.num_restarts else ""
    name = loss_name(snapshot.latest)
    loss = None if name is None else snapshot.latest[name]
    rate = snapshot.steps_per_second
    rows: list[tuple[str, str | Text]] = [
        ("job", f"{record.id} ({record.name})"),
        ("final state", state_badge(record.state)),
        ("attempts", f"{record.attempt}{restarts}"),
    ]
    if snapshot.step is None:  # no air.log step: say what is known, not rows of dashes
        rows.append(("run", outcome_line(record)))
    else:
        rows.append(("steps", str(snapshot.steps_done)))  # a count, not the last index
        if loss is not None:
            rows.append(("final loss", _fmt(loss)))
        if rate is not None:
            rows.append(("steps/second", f"{rate:.1f}"))
        if record.goodput is not None:
            rows.append(("goodput", goodput_text(record).removeprefix("goodput ")))
    if snapshot.tokens_per_s is not None:
        rows.append(("tokens/second", _si(snapshot.tokens_per_s)))
    if snapshot.mfu is not None:
        rows.append(("MFU", format_value(snapshot.mfu, ".1%")))
    if snapshot.step is not None and record.started_at is not None and record.ended_at is not None:
        rows.append(("wall time", f"{record.ended_at - record.started_at:.1f} s"))
    width = max(len(label) for label, _ in rows) + 2
    return Group(*(Text.assemble((label.ljust(width), "dim"), value) for label, value in rows))


class ProgressView:
    """A live progress line for a followed job: redrawn in place on a terminal
    (at most `MAX_REDRAWS_PER_S`), one line per state change elsewhere (CI, pipes).
    Log lines (`log`) are printed above it as they come.

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
        self._last_state: JobState | None = None
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

    def log(self, rank: int | None, lines: Sequence[str]) -> None:
        """Print a rank's output lines, `[rank R] ` first, as `air logs` does (above the
        live line on a terminal; the text is the script's, never read as markup)."""
        prefix = f"[rank {rank if rank is not None else '?'}] "
        for line in lines:
            self.console.print(Text(prefix + line), soft_wrap=True)

    def update(self, snapshot: JobSnapshot, *, force: bool = False) -> None:
        self._snapshot = snapshot
        if self._live is None:
            # Not a terminal (CI, a pipe): a line per state change, and the final line
            # when it says more than the last one printed.
            line = progress_line(snapshot)
            if snapshot.state is not self._last_state or (force and line.plain != self._last_plain):
                self._last_state, self._last_plain = snapshot.state, line.plain
                self.console.print(line, soft_wrap=True)
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 1.0 / MAX_REDRAWS_PER_S:
            return
        self._last_draw = now
        line = progress_line(snapshot, elapsed_s=now - self._started)
        self._live.update(line, refresh=True)


#: which ranks' output `watch` prints: rank 0's (as `ray job submit` shows the
#: driver's), every rank's, or none
LogRanks = Literal["rank0", "all", "none"]


def watch(
    job: Job, console: Console, *, log_ranks: LogRanks = "rank0"
) -> tuple[JobSnapshot, JobRecord]:
    """Follow `job` to its end with a `ProgressView`, printing the output of
    `log_ranks` as it comes; return the final snapshot and record.

    Example:
        >>> snapshot, record = watch(client.job("train-5d41402a"), console)  # doctest: +SKIP
    """
    snapshot = job.new_snapshot()
    with ProgressView(console) as view:
        view.update(snapshot)
        for event in job.follow(after=0):
            snapshot.apply(event)
            if event.type is EventType.LOG and (
                log_ranks == "all" or (log_ranks == "rank0" and event.rank == 0)
            ):
                view.log(event.rank, event.payload_as(LogBatch).lines)
            view.update(snapshot)
    return snapshot, job.record()


def follow_to_end(job: Job, console: Console, *, log_ranks: LogRanks = "rank0") -> int:
    """Live progress and the output of `log_ranks` until the job ends, then the
    summary (and the failure, if any).

    Returns the exit code for the command: 0 when the job SUCCEEDED, else 1.
    KeyboardInterrupt passes through (the caller says how to reattach).

    Example:
        >>> raise SystemExit(follow_to_end(job, console))  # doctest: +SKIP
    """
    snapshot, record = watch(job, console, log_ranks=log_ranks)
    console.print(summary_table(record, snapshot))
    if record.state is JobState.FAILED:
        # the ranks whose output was printed above: their tracebacks are not shown again
        printed = {
            r for r in snapshot.log_tail if log_ranks == "all" or (log_ranks, r) == ("rank0", 0)
        }
        for line in failure_lines(record, snapshot, shown_ranks=printed):
            console.print(line, soft_wrap=True)
    elif record.state is not JobState.SUCCEEDED:
        console.print(
            f"{record.state.value.lower()}: {record.state_reason or 'no reason given'}",
            soft_wrap=True,
        )
    return exit_code_of(record.state)


def exit_code_of(state: JobState) -> int:
    """The exit code of a command that followed a job to `state`: 0 for SUCCEEDED, 1
    for FAILED or CANCELLED (docs/cli.md).

    Example:
        >>> exit_code_of(JobState.SUCCEEDED), exit_code_of(JobState.CANCELLED)
        (0, 1)
    """
    return 0 if state is JobState.SUCCEEDED else 1
