"""JobSnapshot -> HTML fragment and plain text: what the monitor shows, as pure functions.
The numbers in them (formats, the total, the ETA, throughput) are `figures.py`'s,
re-exported here.

Nothing here draws a widget, makes a request or imports matplotlib: the live
monitor (`monitor.py`) puts these fragments into its widgets, and the same
functions give the static `text/html` and `text/plain` a notebook keeps when
it is exported (nbconvert, GitHub) or read in a terminal.

Every piece of user text (names, metric names, log lines, failure reasons,
checkpoint fields) is HTML-escaped here, in one place: `_esc`.

Example:
    >>> snap = JobSnapshot(job_id="j")
    >>> "QUEUED" in render_text(snap)
    True
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence

from air_sdk.notebook.figures import (
    default_metric,
    eta_seconds,
    format_bytes,
    format_duration,
    format_number,
    format_rate,
    metric_names,
    mfu,
    progress_text,
    resolve_total_steps,
    throughput,
)
from air_sdk.notebook.job_views import failure_text
from air_sdk.schema.snapshot import DERIVED_METRICS, JobSnapshot, metric_order
from air_sdk.schema.state import JobState
from air_sdk.text import clock, plural, user_traceback

__all__ = [
    "DEFAULT_LOG_LINES",
    "badge_html",
    "checkpoints_html",
    "default_metric",
    "error_html",
    "escape",
    "eta_seconds",
    "exports_html",
    "failure_html",
    "format_bytes",
    "format_duration",
    "format_number",
    "format_rate",
    "logs_html",
    "metric_names",
    "metrics_html",
    "mfu",
    "progress_text",
    "render_html",
    "render_text",
    "resolve_total_steps",
    "throughput",
    "utilization_html",
]

#: log lines shown per rank (the snapshot keeps 50)
DEFAULT_LOG_LINES = 20
#: newest checkpoints listed; older ones are counted, not listed
MAX_CHECKPOINT_ROWS = 10
#: ranks whose log tail the static page carries (the failing rank first)
MAX_LOG_RANKS = 8
#: latest metric values shown beside the throughput
MAX_SHOWN_METRICS = 12

_STATE_COLOURS = {
    JobState.QUEUED: "#6b7280",
    JobState.SCHEDULED: "#0891b2",
    JobState.STARTING: "#0891b2",
    JobState.RUNNING: "#16a34a",
    JobState.RESTARTING: "#d97706",
    JobState.SUCCEEDED: "#15803d",
    JobState.FAILED: "#dc2626",
    JobState.CANCELLED: "#4b5563",
}
_BORDER = "var(--jp-border-color2, #d0d0d0)"
_MUTED = "var(--jp-ui-font-color2, #666)"
_TABLE = f"border-collapse:collapse;font-size:12px;margin:2px 0;border:1px solid {_BORDER}"
_CELL = f"padding:1px 8px;border:1px solid {_BORDER}"
_PRE = (
    "margin:2px 0;padding:4px 6px;font-size:11px;line-height:1.3;max-height:22em;"
    f"overflow:auto;white-space:pre-wrap;word-break:break-all;border:1px solid {_BORDER}"
)


def escape(value: object) -> str:
    """`str(value)` made safe to put in HTML (the one escaping function of the monitor).

    Example:
        >>> escape("<script>")
        '&lt;script&gt;'
    """
    return html.escape(str(value), quote=True)


_esc = escape


# -- sections (each an HTML fragment the widget and the static page share) ------


def badge_html(snapshot: JobSnapshot, *, name: str | None = None) -> str:
    """The state in capitals on its colour, the job, and the attempt."""
    colour = _STATE_COLOURS.get(snapshot.state, "#6b7280")
    badge = (
        f'<span class="air-badge" style="background:{colour};color:#fff;font-weight:600;'
        f'padding:1px 8px;border-radius:4px;letter-spacing:0.03em">{_esc(snapshot.state.value)}</span>'
    )
    label = _esc(snapshot.job_id) + (f" ({_esc(name)})" if name else "")
    attempt = f"attempt {snapshot.attempt}{_restarts(snapshot.num_restarts)}"
    reason = ""
    if snapshot.state_reason and snapshot.state is not JobState.RUNNING:
        reason = f' <span style="color:{_MUTED}">{_esc(snapshot.state_reason)}</span>'
    return f"{badge} <b>{label}</b> &middot; {attempt}{reason}"


def _restarts(num_restarts: int) -> str:
    if not num_restarts:
        return ""
    return f" ({plural(num_restarts, 'restart')})"


def _perf_pieces(snapshot: JobSnapshot) -> list[str]:
    pieces = [f"{format_number(value)} {unit}" for unit, value in throughput(snapshot)]
    utilization = mfu(snapshot)
    if utilization is not None:
        pieces.append(f"MFU {utilization:.1%}")
    return pieces


def _shown_metrics(snapshot: JobSnapshot) -> list[str]:
    # Throughput and MFU are shown as such, not again among the logged values.
    names = [n for n in snapshot.latest if n not in DERIVED_METRICS]
    return sorted(names, key=metric_order)[:MAX_SHOWN_METRICS]


def metrics_html(snapshot: JobSnapshot) -> str:
    """Throughput, MFU, the latest value of every metric and the data-loading line
    ("" before any)."""
    parts: list[str] = []
    perf = _perf_pieces(snapshot)
    if perf:
        parts.append("<b>" + " &middot; ".join(_esc(p) for p in perf) + "</b>")
    names = _shown_metrics(snapshot)
    if names:
        parts.append(
            " &middot; ".join(
                f'<span style="color:{_MUTED}">{_esc(n)}</span> {_esc(format_number(snapshot.latest[n]))}'
                for n in names
            )
        )
    data = snapshot.data_summary
    if data is not None and data.describe():
        parts.append(f'<span class="air-data"><b>data</b> {_esc(data.describe())}</span>')
    if snapshot.dropped_points:
        parts.append(
            f'<span style="color:#d97706">{snapshot.dropped_points} metric points dropped'
            " on the workers (the gateway fell behind)</span>"
        )
    return "<br>".join(parts)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str | tuple[str, str]]]) -> str:
    """An HTML table; a cell is its text, or (text, what hovering over it shows)."""
    head = "".join(f'<th style="{_CELL};text-align:left">{_esc(h)}</th>' for h in headers)
    body = "".join("<tr>" + "".join(_td(cell) for cell in row) + "</tr>" for row in rows)
    return f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _td(cell: str | tuple[str, str]) -> str:
    text, title = cell if isinstance(cell, tuple) else (cell, None)
    hover = "" if title is None or title == text else f' title="{_esc(title)}"'
    # Numbers line up on the right, names on the left.
    align = "right" if text[:1].isdigit() else "left"
    return f'<td style="{_CELL};text-align:{align}"{hover}>{_esc(text)}</td>'


def _opt(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def utilization_html(snapshot: JobSnapshot) -> str:
    """One row per node and device: util %, memory, power ("" before any sample; once
    the job ended, that it ended: its last sample is not how busy the devices are now)."""
    if not snapshot.utilization:
        return ""
    if snapshot.state.terminal:
        return f'<b>utilization</b> <span style="color:{_MUTED}">ended with the job</span>'
    rows = []
    for key in sorted(snapshot.utilization):
        s = snapshot.utilization[key]
        if s.mem_used_mib is not None and s.mem_total_mib:
            memory = f"{s.mem_used_mib / 1024:.1f} / {s.mem_total_mib / 1024:.1f} GiB"
        else:
            memory = _opt(s.mem_used_mib, "{:.0f} MiB")
        rows.append(
            [s.node, s.device, _opt(s.util_pct, "{:.0f}%"), memory, _opt(s.power_w, "{:.0f} W")]
        )
    return "<b>utilization</b>" + _table(["node", "device", "util", "memory", "power"], rows)


def checkpoints_html(snapshot: JobSnapshot) -> str:
    """The committed checkpoints, newest first: step, when it was saved (a clock time,
    which a page read later keeps right), attempt, size, how long the training loop
    waited and when the checkpoint was durable, and where it is (the last two parts;
    the whole path on hover).

    Example:
        >>> from air_sdk.schema import CheckpointCommit
        >>> ck = CheckpointCommit(step=100, path="/srv/air/jobs/j/checkpoints/step-100",
        ...     world_size=1, size_bytes=0, num_files=1, blocked_s=0, durable_s=0)
        >>> page = checkpoints_html(JobSnapshot(job_id="j", checkpoints=[ck]))
        >>> 'title="/srv/air/jobs/j/checkpoints/step-100">…/checkpoints/step-100<' in page
        True
    """
    if not snapshot.checkpoints:
        return ""
    columns = ["step", "saved", "attempt", "size", "blocked", "durable after", "path"]
    shown = snapshot.checkpoints[-MAX_CHECKPOINT_ROWS:][::-1]
    rows: list[list[str | tuple[str, str]]] = [
        [
            f"{ck.step} (at the failure)" if ck.at_failure else str(ck.step),
            "" if ck.committed_at is None else clock(ck.committed_at),
            str(ck.attempt),
            format_bytes(ck.size_bytes),
            f"{ck.blocked_s:.2f} s",
            f"{ck.durable_s:.2f} s",
            (_short_path(ck.path), ck.path),
        ]
        for ck in shown
    ]
    older = len(snapshot.checkpoints) - len(shown)
    note = f'<div style="color:{_MUTED};font-size:11px">and {older} older</div>' if older else ""
    count = len(snapshot.checkpoints)
    return f"<b>checkpoints ({count})</b>" + _table(columns, rows) + note


_EXPORT_COLOURS = {"running": _MUTED, "done": "#15803d", "failed": "#dc2626"}


def exports_html(snapshot: JobSnapshot) -> str:
    """One line per tracker the job exports to: where the data goes and how it went
    (`ExportStatus.describe()`, as `air status` says it), the state in its colour.

    Example:
        >>> from air_sdk.schema import ExportStatus
        >>> done = ExportStatus(to="tensorboard", state="done", location="/h/<tb>")
        >>> page = exports_html(JobSnapshot(job_id="j", exports={"tensorboard": done}))
        >>> "export to tensorboard: done, /h/&lt;tb&gt;" in page
        True
    """
    lines = [
        f'<div style="color:{_EXPORT_COLOURS.get(e.state, _MUTED)}">{_esc(e.describe())}</div>'
        for _, e in sorted(snapshot.exports.items())
    ]
    return f'<div style="font-size:12px">{"".join(lines)}</div>' if lines else ""


def _short_path(path: str) -> str:
    """The last two parts of a path: the run's checkpoint folder and the step's."""
    parts = path.rstrip("/").split("/")
    return path if len(parts) <= 3 else "…/" + "/".join(parts[-2:])


def _pre(lines: Sequence[str]) -> str:
    return f'<pre style="{_PRE}">' + _esc("\n".join(lines)) + "</pre>"


def failure_html(snapshot: JobSnapshot, *, max_lines: int = DEFAULT_LOG_LINES) -> str:
    """Why the latest failed attempt failed: reason, rank, exit code or signal, log tail."""
    failure = snapshot.failure
    if failure is None:
        if snapshot.state is JobState.FAILED:
            reason = snapshot.state_reason or "no reason recorded"
            return f'<div style="color:#dc2626"><b>failed:</b> {_esc(reason)}</div>'
        return ""
    if snapshot.state is JobState.FAILED:
        title = f"attempt {failure.attempt} failed; the job FAILED"
    elif snapshot.state is JobState.RESTARTING:
        title = f"attempt {failure.attempt} failed; restarting"
    else:
        title = f"attempt {failure.attempt} failed"
        if snapshot.attempt > failure.attempt:
            title += f" (recovered: attempt {snapshot.attempt})"
    parts = [f"<b>{_esc(title)}:</b> {_esc(failure_text(failure))}"]
    others = [e for e in failure.rank_exits if not e.ok and e.rank != failure.rank]
    if others:
        parts.append("then: " + _esc("; ".join(e.describe() for e in others)))
    tail = list(failure.log_tail)
    if not tail and failure.rank is not None:
        tail = snapshot.log_tail.get(failure.rank, [])
    body = "<br>".join(parts)
    if tail:
        body += _pre(user_traceback(tail, snapshot.job_id)[-max_lines:])
    return f'<div style="color:#b91c1c">{body}</div>'


def error_html(message: str) -> str:
    """A problem of the monitor itself (a lost stream, a failed cancel), in amber.

    Example:
        >>> error_html("lost <stream>")  # doctest: +ELLIPSIS
        '<div ...>&#9888; lost &lt;stream&gt;</div>'
    """
    return f'<div style="color:#b45309;font-size:12px">&#9888; {_esc(message)}</div>'


def logs_html(lines: Sequence[str], *, max_lines: int = DEFAULT_LOG_LINES) -> str:
    """The last `max_lines` lines in an escaped `<pre>`.

    Example:
        >>> logs_html(["<script>x</script>"])  # doctest: +ELLIPSIS
        '<pre ...>&lt;script&gt;x&lt;/script&gt;</pre>'
    """
    if not lines:
        return f'<div style="color:{_MUTED};font-size:12px">no output yet</div>'
    return _pre(list(lines)[-max_lines:])


# -- whole views ---------------------------------------------------------------


def render_html(
    snapshot: JobSnapshot,
    *,
    name: str | None = None,
    chart_png: bytes | None = None,
    total_steps: int | None = None,
    max_log_lines: int = DEFAULT_LOG_LINES,
    max_log_ranks: int = MAX_LOG_RANKS,
) -> str:
    """A self-contained HTML fragment of the whole monitor (the static copy a notebook
    keeps, and the /ui job page): badge, progress, metrics, chart (an inline PNG),
    utilization, checkpoints, exports to trackers, failure and each rank's last log
    lines.

    Example:
        >>> page = render_html(JobSnapshot(job_id="j"), name="demo")
        >>> "QUEUED" in page and "demo" in page
        True
    """
    total = resolve_total_steps(snapshot, total_steps)
    parts = [f"<div>{badge_html(snapshot, name=name)}</div>"]
    progress = _esc(progress_text(snapshot, total_steps=total_steps))
    if total is not None and snapshot.steps_done is not None:
        value = min(snapshot.steps_done, total)
        progress = (
            f'<progress value="{value}" max="{total}" style="width:240px"></progress> {progress}'
        )
    parts.append(f"<div>{progress}</div>")
    for section in (
        metrics_html(snapshot),
        _chart_img(chart_png),
        utilization_html(snapshot),
        checkpoints_html(snapshot),
        exports_html(snapshot),
        failure_html(snapshot, max_lines=max_log_lines),
    ):
        if section:
            parts.append(f"<div>{section}</div>")
    # The failing rank first, then the lowest ranks: a 64-rank job must not put
    # 64 logs into the notebook file.
    failing = snapshot.failure.rank if snapshot.failure is not None else None
    ranks = sorted(snapshot.log_tail, key=lambda rank: (rank != failing, rank))
    for rank in ranks[:max_log_ranks]:
        parts.append(
            f"<div><b>rank {rank} log</b>"
            + logs_html(snapshot.log_tail[rank], max_lines=max_log_lines)
            + "</div>"
        )
    if len(ranks) > max_log_ranks:
        parts.append(
            f'<div style="color:{_MUTED}">and the logs of'
            f" {plural(len(ranks) - max_log_ranks, 'more rank')} (job.logs(rank=...))</div>"
        )
    body = "".join(parts)
    return (
        '<div class="air-static" style="font-family:var(--jp-ui-font-family, sans-serif);'
        f'font-size:13px;line-height:1.5">{body}</div>'
    )


def _chart_img(chart_png: bytes | None) -> str:
    if not chart_png:
        return ""
    data = base64.b64encode(chart_png).decode("ascii")
    return f'<img alt="metric chart" src="data:image/png;base64,{data}">'


def render_text(
    snapshot: JobSnapshot,
    *,
    name: str | None = None,
    total_steps: int | None = None,
    max_log_lines: int = 5,
) -> str:
    """A plain-text summary for terminals and non-Jupyter front ends.

    Example:
        >>> print(render_text(JobSnapshot(job_id="j"), name="demo"))
        j (demo)  QUEUED  attempt 0
        no steps yet
    """
    restarts = _restarts(snapshot.num_restarts)
    label = snapshot.job_id + (f" ({name})" if name else "")
    lines = [f"{label}  {snapshot.state.value}  attempt {snapshot.attempt}{restarts}"]
    if snapshot.state_reason and snapshot.state is not JobState.RUNNING:
        lines[0] += f"  {snapshot.state_reason}"
    lines.append(progress_text(snapshot, total_steps=total_steps).replace(" · ", "  "))
    names = _shown_metrics(snapshot)
    if names:
        lines.append("  ".join(f"{n} {format_number(snapshot.latest[n])}" for n in names))
    perf = _perf_pieces(snapshot)
    if perf:
        lines.append("  ".join(perf))
    data = snapshot.data_summary
    if data is not None and data.describe():
        lines.append(f"data {data.describe()}")
    for key in sorted(snapshot.utilization) if not snapshot.state.terminal else ():
        s = snapshot.utilization[key]
        cells = [f"{s.node}/{s.device}", _opt(s.util_pct, "{:.0f}%")]
        if s.mem_used_mib is not None and s.mem_total_mib:
            cells.append(f"{s.mem_used_mib / 1024:.1f}/{s.mem_total_mib / 1024:.1f} GiB")
        cells.append(_opt(s.power_w, "{:.0f} W"))
        lines.append("util " + " ".join(c for c in cells if c))
    if snapshot.checkpoints:
        latest = snapshot.checkpoints[-1].step
        lines.append(f"checkpoints: {len(snapshot.checkpoints)} (latest at step {latest})")
    lines.extend(e.describe() for _, e in sorted(snapshot.exports.items()))
    failure = snapshot.failure
    if failure is not None:
        lines.append(f"attempt {failure.attempt} failed: {failure_text(failure)}")
        tail = list(failure.log_tail)
        if not tail and failure.rank is not None:
            tail = snapshot.log_tail.get(failure.rank, [])
        lines.extend(
            f"  | {line}" for line in user_traceback(tail, snapshot.job_id)[-max_log_lines:]
        )
    elif snapshot.state is JobState.FAILED:
        lines.append(f"failed: {snapshot.state_reason or 'no reason recorded'}")
    return "\n".join(lines)
