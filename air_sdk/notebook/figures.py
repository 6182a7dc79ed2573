"""What a snapshot's numbers say, in words: metric values, sizes, durations and rates
formatted for people, and what is derived from them (the run's total steps, the ETA,
throughput, the progress line, the metrics worth charting). Pure functions of a
`JobSnapshot`, shared by the monitor's HTML (`snapshot_html.py`) and its widgets.

Example:
    >>> progress_text(JobSnapshot(job_id="j"))
    'no steps yet'
"""

from __future__ import annotations

import math

from air_sdk.schema.snapshot import TOTAL_STEPS_METRIC, JobSnapshot, metric_order

__all__ = [
    "TOTAL_STEPS_METRIC",
    "default_metric",
    "eta_seconds",
    "format_bytes",
    "format_duration",
    "format_number",
    "format_rate",
    "metric_names",
    "mfu",
    "progress_text",
    "resolve_total_steps",
    "throughput",
]

# -- numbers -------------------------------------------------------------------


def format_number(value: float) -> str:
    """A metric value: 4 significant digits, k/M/G/T/P for large magnitudes.

    Example:
        >>> format_number(0.012345), format_number(74740.0), format_number(3.2e12)
        ('0.01235', '74.74k', '3.2T')
    """
    if math.isnan(value) or math.isinf(value):
        return str(value)
    size = abs(value)
    for suffix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if size >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


def format_bytes(num_bytes: float) -> str:
    """A size in binary units.

    Example:
        >>> format_bytes(3 * 1024**3)
        '3.0 GiB'
    """
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """A duration for an ETA: 42s, 3m 05s, 1h 02m, 2d 03h.

    Example:
        >>> format_duration(185), format_duration(3725)
        ('3m 05s', '1h 02m')
    """
    total = max(int(round(seconds)), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_rate(steps_per_s: float | None) -> str:
    """Steps per second, or seconds per step when a step takes longer than one.

    Example:
        >>> format_rate(45.06), format_rate(0.25), format_rate(None)
        ('45.1 steps/s', '4.0 s/step', '')
    """
    if steps_per_s is None or steps_per_s <= 0 or not math.isfinite(steps_per_s):
        return ""
    if steps_per_s < 1:
        return f"{1 / steps_per_s:.1f} s/step"
    return f"{steps_per_s:.1f} steps/s"


# -- derived values ------------------------------------------------------------


def resolve_total_steps(snapshot: JobSnapshot, total_steps: int | None = None) -> int | None:
    """The run's length: the monitor's `total_steps=` option, else the snapshot's (a
    `total_steps` a rank logged, else the spec's), else a logged `total_steps` of a
    snapshot folded before it had the field.

    Example:
        >>> resolve_total_steps(JobSnapshot(job_id="j"), 500)
        500
        >>> resolve_total_steps(JobSnapshot(job_id="j", total_steps=150))
        150
    """
    if total_steps is not None:
        return total_steps
    if snapshot.total_steps is not None:
        return snapshot.total_steps
    logged = snapshot.latest.get(TOTAL_STEPS_METRIC)
    if logged is None or not math.isfinite(logged) or logged < 1:
        return None
    return int(logged)


def eta_seconds(snapshot: JobSnapshot, total_steps: int | None = None) -> float | None:
    """Seconds left at the average rate so far; None without a known total or a rate.

    Example:
        >>> eta_seconds(JobSnapshot(job_id="j"), 100) is None  # no steps yet
        True
    """
    total = resolve_total_steps(snapshot, total_steps)
    rate = snapshot.steps_per_second
    done = snapshot.steps_done
    if total is None or rate is None or rate <= 0 or done is None:
        return None
    if snapshot.state.terminal:
        return None
    return max(total - done, 0) / rate


def throughput(snapshot: JobSnapshot) -> list[tuple[str, float]]:
    """Samples and tokens per second. Tokens/s is what the worker runtime derives from
    `air.log(..., tokens=N)` for the whole job (`tokens_per_s`); samples/s is logged
    directly (`samples_per_s`) or per step (`samples`) times steps per second.

    Example:
        >>> snap = JobSnapshot(job_id="j", latest={"tokens_per_s": 5e4})
        >>> throughput(snap)
        [('tokens/s', 50000.0)]
    """
    rate = snapshot.steps_per_second
    found: list[tuple[str, float]] = []
    samples = snapshot.latest.get("samples_per_s")
    per_step = snapshot.latest.get("samples")
    if samples is None and per_step is not None and rate is not None:
        samples = per_step * rate
    if samples is not None:
        found.append(("samples/s", samples))
    # `tokens` is per rank: only the runtime, which knows the data-parallel size, scales it
    if snapshot.tokens_per_s is not None:
        found.append(("tokens/s", snapshot.tokens_per_s))
    return found


def mfu(snapshot: JobSnapshot) -> float | None:
    """Model FLOPs utilization, 0..1, as the worker runtime measured it from
    `air.log(..., tokens=N)` (None on CPU or before it is known).

    Example:
        >>> mfu(JobSnapshot(job_id="j", latest={"mfu": 0.4}))
        0.4
    """
    return snapshot.mfu


def metric_names(snapshot: JobSnapshot) -> list[str]:
    """Charted metric names: losses first ("loss", then "train_loss"-like), then the rest.

    Example:
        >>> metric_names(JobSnapshot(job_id="j", series={"lr": [], "loss": []}))
        ['loss', 'lr']
    """
    return sorted(snapshot.series, key=metric_order)


def default_metric(snapshot: JobSnapshot) -> str | None:
    """The metric charted unless the user picks another: "loss" when logged.

    Example:
        >>> default_metric(JobSnapshot(job_id="j")) is None
        True
    """
    names = metric_names(snapshot)
    return names[0] if names else None


def progress_text(snapshot: JobSnapshot, *, total_steps: int | None = None) -> str:
    """`step 120 / 1000 (12%) · 45.1 steps/s · ETA 3m 05s` (plain text, no markup). The
    step is a count (`JobSnapshot.steps_done`): a 0-based loop's last step 149 of 150
    reads `step 150 / 150`.

    Example:
        >>> progress_text(JobSnapshot(job_id="j"))
        'no steps yet'
        >>> progress_text(JobSnapshot(job_id="j", step=149, first_point_step=0), total_steps=150)
        'step 150 / 150 (100%)'
    """
    done = snapshot.steps_done
    if done is None:
        return "no steps yet"
    total = resolve_total_steps(snapshot, total_steps)
    pieces = [f"step {done}"]
    if total is not None:
        pieces[0] += f" / {total} ({min(done / total, 1.0):.0%})"
    rate = format_rate(snapshot.steps_per_second)
    if rate:
        pieces.append(rate)
    eta = eta_seconds(snapshot, total_steps)
    if eta is not None:
        pieces.append(f"ETA {format_duration(eta)}")
    return " · ".join(pieces)
