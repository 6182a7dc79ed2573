"""What a NodeRunner leaves on disk, and reading it back (standard library only).

On the local backend a NodeRunner process keeps two records, each rewritten whole
and renamed into place (a reader never sees half of one), so a gateway that was
SIGKILLed and restarted finds its nodes again without scanning the host:

    jobs/<job>/nodes/<node>/runner.json      RunnerRecord: the NodeRunner process (pid,
                                             start time), the attempt it runs, warm ones
    jobs/<job>/attempts/<n>/nodes/<node>.json
                                             AttemptRecord: that attempt on that node: each
                                             rank's pid, start time and exit code, and
                                             the node's verdict once there is one

A pid is trusted only with its start time (`_procs.alive(pid, create_time)`): a
later process that got the pid is not the one recorded.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from air_sdk.errors import UnsafePathError
from air_sdk.runner.nofollow import open_append, open_dir, open_file

__all__ = [
    "MAX_EXIT_RECORD_BYTES",
    "AttemptRecord",
    "RankRecord",
    "RunnerRecord",
    "exit_records",
    "failure_marks",
    "rank_exits",
    "log_tail",
    "open_node_log",
    "read_json",
    "write_json",
]


@dataclass(frozen=True)
class RankRecord:
    """One rank of an attempt on a node."""

    rank: int
    local_rank: int
    pid: int
    create_time: float | None
    #: Popen's: negative for a signal; None while it runs (or nobody reaped it yet)
    returncode: int | None = None
    #: it started on a warm interpreter
    warm: bool = False


@dataclass(frozen=True)
class AttemptRecord:
    """An attempt on one node, as its NodeRunner saw it last."""

    job_id: str
    attempt: int
    node: str
    runner_pid: int
    runner_create_time: float | None
    ranks: list[RankRecord] = field(default_factory=list)
    #: (exit status, what happened) once a rank failed or all ended
    verdict: tuple[int, str] | None = None
    #: the runner stopped the attempt and every rank is gone
    stopped: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptRecord:
        values = dict(data)
        values["ranks"] = [RankRecord(**r) for r in values.get("ranks", [])]
        if values.get("verdict") is not None:
            code, detail = values["verdict"]
            values["verdict"] = (int(code), str(detail))
        return cls(**values)


@dataclass(frozen=True)
class RunnerRecord:
    """A local NodeRunner process: who it is and what it is doing."""

    pid: int
    create_time: float | None
    job_id: str
    node: str
    #: the attempt it runs or ran last (None before the first)
    attempt: int | None = None
    #: an attempt's ranks run (False: stopped or ended, waiting for the next launch)
    busy: bool = False
    warm_ready: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunnerRecord:
        return cls(**data)


def write_json(path: Path, data: Any) -> None:
    """Write `data` (a dataclass or JSON value) to `path` atomically, readable by its
    owner only (a launch holds the job's token)."""
    body = json.dumps(asdict(data) if hasattr(data, "__dataclass_fields__") else data)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    """The JSON at `path`; None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


#: the most bytes read of one rank's exit record (a few KiB with its output tail)
MAX_EXIT_RECORD_BYTES = 1 << 20


def exit_records(base: Path, exits: str = "exits") -> Iterator[tuple[bytes, float]]:
    """(bytes, mtime) of each `rank-*.json` the ranks' supervisors wrote in `base /
    exits` (an attempt's directory, `air_sdk.runtime.supervise.write_exit_record`).
    The job writes that directory: a link, a FIFO or a device there is skipped (read by
    fd, `O_NOFOLLOW` below `base`, regular files only, at most `MAX_EXIT_RECORD_BYTES`),
    so it can neither point the reader at other files nor hang it on a read.

    Example:
        >>> list(exit_records(Path("/nonexistent")))
        []
    """
    try:
        folder = open_dir(base, exits)
    except (OSError, UnsafePathError):
        return
    try:
        for name in sorted(os.listdir(folder)):
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            try:
                with os.fdopen(open_file(folder, name), "rb") as f:
                    yield f.read(MAX_EXIT_RECORD_BYTES), os.fstat(f.fileno()).st_mtime
            except (OSError, UnsafePathError):
                continue
    finally:
        os.close(folder)


def rank_exits(records: Iterable[tuple[bytes, float]]) -> Iterator[tuple[Any, float]]:
    """(`RankExit`, when it ended: its `ended_at`, else its file's mtime) of each of
    `records` (`exit_records`' pairs) that parses; one that does not is skipped (the job
    writes their directory). The schema is imported here, so this module stays light to
    import.

    Example:
        >>> list(rank_exits(exit_records(Path("/nonexistent"))))
        []
    """
    from air_sdk.schema import RankExit

    for raw, mtime in records:
        try:
            e = RankExit.model_validate_json(raw)
        except ValueError:
            continue
        yield e, e.ended_at or mtime


def failure_marks(attempt_dir: Path) -> list[str]:
    """The files ranks left under `ATTEMPT_DIR/failure-saves/` (see
    `air_sdk.runtime._failure_save`).

    Example:
        >>> failure_marks(Path("/nonexistent"))
        []
    """
    from air_sdk.runtime._failure_save import MARKER_DIR

    try:
        return sorted(p.name for p in (attempt_dir / MARKER_DIR).iterdir())
    except OSError:
        return []


def log_tail(path: Path, num_lines: int = 20) -> list[str]:
    """The last `num_lines` lines of a node's log.

    Example:
        >>> log_tail(Path("/nonexistent"))
        []
    """
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip("\n") for line in deque(f, maxlen=num_lines)]
    except OSError:
        return []


def open_node_log(attempt_dir: str, log_path: str) -> IO[bytes]:
    """A node's log of one attempt, opened for appending (kept until the next attempt).
    The job's ranks can write its attempts directory and the NodeRunner runs as the
    gateway's user: a link they planted at the log, or at a directory between the
    job's own directory and it, is replaced, never written through
    (`runner.nofollow.open_append`).

    Example:
        >>> import tempfile
        >>> job = Path(tempfile.mkdtemp())
        >>> (job / "attempts").mkdir(); os.symlink("/etc", job / "attempts" / "2")
        >>> open_node_log(f"{job}/attempts/2", f"{job}/attempts/2/nodes/n0.log").close()
        >>> (job / "attempts" / "2").is_symlink(), (job / "attempts/2/nodes/n0.log").is_file()
        (False, True)
    """
    attempt, log = Path(attempt_dir), Path(log_path)
    job_root = attempt.parent.parent  # <job>/attempts/<n>: the gateway made <job>
    if attempt.is_relative_to(job_root) and log.is_relative_to(attempt):
        os.close(open_dir(job_root, attempt.relative_to(job_root).as_posix(), create=True))
        fd = open_append(job_root, log.relative_to(job_root).as_posix(), 0o644)
    else:  # elsewhere (a Ray node's own disk): no job wrote there before this attempt
        attempt.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "ab")
