"""`air gc`: free the disk the files of ended jobs and unused unpacked bundles take.

    air gc --dry-run             # what would go, and the bytes that would be freed
    air gc                       # what the gateway's retention would delete, now
    air gc --older-than 0        # the files of every ended job
    air gc --include-checkpoints # and the checkpoints under them (kept by default)

The gateway decides and deletes (`POST /v1/admin/gc`; an admin token of the system
tenant, as the embedded gateway's is). Records, events, logs and metrics stay.
"""

from __future__ import annotations

import re
import time
from typing import Annotated

import typer

from air_sdk.cli._common import GatewayOption, JsonOption, console, echo_json, handle_errors
from air_sdk.text import plural

__all__ = ["gc", "human_bytes", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in "90", "30m", "12h", "7d" or "2w".

    Example:
        >>> parse_duration("12h"), parse_duration("0"), parse_duration("1.5d")
        (43200.0, 0.0, 129600.0)
    """
    match = _DURATION.match(text)
    if match is None:
        raise typer.BadParameter(
            f"{text!r} is not a duration: give a number with s, m, h, d or w (e.g. 7d, 12h, 0)",
            param_hint="'--older-than'",
        )
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def human_bytes(num_bytes: int) -> str:
    """Bytes as people read them.

    Example:
        >>> human_bytes(0), human_bytes(1536), human_bytes(419430400)
        ('0 bytes', '1.5 KiB', '400.0 MiB')
    """
    size = float(num_bytes)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop returns at GiB


@handle_errors
def gc(
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", "-n", help="Say what would go and how much; delete nothing."),
    ] = False,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="The files of jobs that ended longer ago than this (7d, 12h, 0 for every"
            " ended job); default: the gateway's retention.",
            show_default=False,
        ),
    ] = None,
    include_checkpoints: Annotated[
        bool,
        typer.Option(
            "--include-checkpoints",
            help="Also delete the checkpoints kept under those jobs (kept by default:"
            " `air checkpoints export` reads them).",
        ),
    ] = False,
    as_json: JsonOption = False,
    gateway: GatewayOption = None,
) -> None:
    """Free the disk the files of ended jobs and unused unpacked bundles take."""
    from air_sdk.cli.main import make_client

    seconds = None if older_than is None else parse_duration(older_than)
    report = make_client(gateway).admin.collect_garbage(
        dry_run=dry_run, older_than_s=seconds, include_checkpoints=include_checkpoints
    )
    if as_json:
        echo_json(report.model_dump(mode="json"))
        return
    verb = "would free" if dry_run else "freed"
    if not report.jobs and not report.bundles and not report.archives:
        console.print(
            f"nothing to free; ended jobs' files take {human_bytes(report.bytes_kept)}"
            + ("" if older_than else " (`air gc --older-than 0` frees every ended job's)"),
            soft_wrap=True,
        )
        return
    now = time.time()
    for job in report.jobs:
        age = (now - job.ended_at) / 86400
        console.print(
            f"{'would delete' if dry_run else 'deleted'} the files of {job.job_id}"
            f" (ended {age:.1f} days ago, {human_bytes(job.bytes)} of its own)",
            soft_wrap=True,
        )
    if report.bundles:
        console.print(
            f"{'would delete' if dry_run else 'deleted'}"
            f" {plural(len(report.bundles), 'unpacked bundle')} no job uses",
            soft_wrap=True,
        )
    if report.archives:
        console.print(
            f"{'would delete' if dry_run else 'deleted'}"
            f" {plural(len(report.archives), 'uploaded bundle')} no running or queued job uses",
            soft_wrap=True,
        )
    console.print(
        f"{verb} {human_bytes(report.bytes_freed)}; ended jobs' files left:"
        f" {human_bytes(report.bytes_kept)}",
        soft_wrap=True,
    )
