"""Per-job limits on memory, processes and disk (`JobLimits`), and the sizes they are
written in ("512MiB", "2G", 1048576).

A job names its limits (`air submit --memory-limit 4GiB --max-processes 256
--disk-limit 20GiB`); an operator caps them (`air gateway start --max-job-memory ...`),
and a job that names none runs under the caps. The NodeRunner enforces them on each
node (`air_sdk.runner.node.limits`); docs/security.md says how and how often.

Example:
    >>> JobLimits(memory="512MiB", processes=64, disk="2G").memory
    536870912
    >>> format_size(536870912), format_size(1000)
    ('512 MiB', '1000 B')
"""

from __future__ import annotations

import re

from pydantic import ConfigDict, Field, field_validator

from air_sdk.schema._guards import WireModel

__all__ = ["MIN_LIMIT_BYTES", "JobLimits", "format_size", "parse_size"]

#: the smallest memory or disk limit: below it not even an interpreter starts
MIN_LIMIT_BYTES = 1 << 20
#: the largest a size may say (1 EiB): past it a number is a typo
_MAX_BYTES = 1 << 60
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)(i?B?)\s*", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def parse_size(value: int | str, *, what: str = "size") -> int:
    """Bytes from an int or a string: `512MiB`, `4GiB`, `2G` and `2g` (binary, as
    docker's --memory), `500MB` (decimal), `1048576` (bytes). A ValueError says what
    was wrong and how to write one.

    Example:
        >>> parse_size("4GiB"), parse_size("2g"), parse_size("500MB"), parse_size(1024)
        (4294967296, 2147483648, 500000000, 1024)
        >>> parse_size("lots", what="--memory-limit")
        Traceback (most recent call last):
        ...
        ValueError: --memory-limit 'lots' is not a size: write bytes or a number with a unit, e.g. 512MiB, 4GiB, 2G
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a size")
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE.fullmatch(str(value)) if len(str(value)) <= 40 else None
        if match is None:
            raise ValueError(
                f"{what} {str(value)[:40]!r} is not a size: write bytes or a number with a"
                " unit, e.g. 512MiB, 4GiB, 2G"
            )
        digits, prefix, tail = match.groups()
        decimal = tail.upper() == "B" and prefix != ""  # MB, GB: powers of 1000
        base = 1000 if decimal else 1024
        number = int(float(digits) * base ** _POWERS[prefix.upper()])
    if not 0 < number <= _MAX_BYTES:
        raise ValueError(f"{what} {value!r} must be more than 0 bytes and at most 1 EiB")
    return number


def format_size(num_bytes: int | float) -> str:
    """A byte count as people read it (binary units, at most one decimal).

    Example:
        >>> format_size(64 << 20), format_size(1536 << 20), format_size(0)
        ('64 MiB', '1.5 GiB', '0 B')
    """
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            text = f"{value:.1f}".rstrip("0").rstrip(".") if unit != "B" else f"{value:.0f}"
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class JobLimits(WireModel):
    """What one job may use on each node it runs on; None: no limit of its own (the
    operator's cap, if any, applies).

    Example:
        >>> JobLimits(memory="64MiB", processes=64).disk is None
        True
        >>> JobLimits(memory="4k")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for JobLimits
        memory
          Value error, memory limit 4 KiB is below 1 MiB: not even an interpreter starts; give more ...
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory: int | None = Field(
        None,
        description="Memory of all the job's processes on a node together (their anonymous"
        " resident memory), in bytes or with a unit (4GiB); past it the job fails with"
        " 'memory limit'.",
    )
    processes: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Processes and threads of the job on a node together; past it the job"
        " fails with 'process limit'.",
    )
    disk: int | None = Field(
        None,
        description="Bytes under the job's writable directories (code, attempts,"
        " checkpoints, outputs, /tmp, /dev/shm), with a unit (20GiB); past it the job fails"
        " with 'disk limit'.",
    )

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _size(cls, v: object, info: object) -> object:
        if v is None:
            return v
        name = getattr(info, "field_name", "size")
        if not isinstance(v, int | str):
            raise ValueError(f"{name} limit {v!r} is not a size: give bytes or e.g. 4GiB")
        size = parse_size(v, what=f"{name} limit")
        if size < MIN_LIMIT_BYTES:
            raise ValueError(
                f"{name} limit {format_size(size)} is below {format_size(MIN_LIMIT_BYTES)}:"
                " not even an interpreter starts; give more"
            )
        return size

    def capped(self, cap: JobLimits) -> JobLimits:
        """These limits under `cap`: each the smaller one, the cap's where none is set.

        Example:
            >>> JobLimits(memory="1GiB").capped(JobLimits(memory="4GiB", processes=64))
            JobLimits(memory=1073741824, processes=64, disk=None)
        """
        values = {}
        for name in ("memory", "processes", "disk"):
            mine, most = getattr(self, name), getattr(cap, name)
            values[name] = most if mine is None else (mine if most is None else min(mine, most))
        return JobLimits(**values)

    def over(self, cap: JobLimits) -> str | None:
        """Which of these limits asks more than `cap` allows, said as the refusal a
        submit gets (None: all within).

        Example:
            >>> print(JobLimits(memory="8GiB").over(JobLimits(memory="4GiB")))
            memory limit 8 GiB is over this gateway's cap of 4 GiB: ask for 4 GiB or less (--memory-limit), or ask the operator (air gateway start --max-job-memory)
        """
        for name, label, flag, setting in (
            ("memory", "memory", "--memory-limit", "--max-job-memory"),
            ("processes", "process", "--max-processes", "--max-job-processes"),
            ("disk", "disk", "--disk-limit", "--max-job-disk"),
        ):
            mine, most = getattr(self, name), getattr(cap, name)
            if mine is not None and most is not None and mine > most:
                show = str if name == "processes" else format_size
                return (
                    f"{label} limit {show(mine)} is over this gateway's cap of {show(most)}:"
                    f" ask for {show(most)} or less ({flag}), or ask the operator (air"
                    f" gateway start {setting})"
                )
        return None

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return any(v is not None for v in (self.memory, self.processes, self.disk))
