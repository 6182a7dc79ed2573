"""Getting every rank's flight recorder dump on a hang, and reading it safely.

The ranks of a GPU job run with torch's flight recorder on and its trigger FIFOs
under the attempt directory (`air_sdk.runtime._flight_recorder`). On a hang the
runner writes to each rank's `rank_<R>.pipe`; torch's monitor thread polls it about
once a second (`TORCH_NCCL_COORD_CHECK_MILSEC`) and writes `rank_<R>`, a pickle of
plain dicts and lists. Dumps written before (NCCL's own watchdog timing out, with
`TORCH_NCCL_DUMP_ON_TIMEOUT`) are read too. `collectives.diagnose` then says which
rank is behind.

A dump is a file a job wrote, so it is read as data only: an unpickler that refuses
every class or function (a real dump has none), and at most `MAX_DUMP_BYTES`.

Example:
    >>> report = hang_report(Path("/nonexistent"), num_ranks=8)
    >>> report is None
    True
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import pickle
import stat
import time
from pathlib import Path
from typing import Any

from air_sdk.runner.collectives import CollectiveDiagnosis, RankTrace, diagnose, summarize
from air_sdk.runtime._flight_recorder import DUMP_PREFIX, TRACE_DIR

__all__ = ["MAX_DUMP_BYTES", "collect", "hang_report", "read_dump", "request_dumps"]

log = logging.getLogger(__name__)

MAX_DUMP_BYTES = 64 * 2**20
#: how long a hang report waits for the ranks' dumps (torch polls its FIFO every second)
DUMP_WAIT_S = 10.0
_POLL_S = 0.25


class _DataOnly(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; refuses anything importable."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump names {module}.{name}; refused")


def _rank_of(path: Path) -> int | None:
    tail = path.name[len(DUMP_PREFIX) :]
    if not path.name.startswith(DUMP_PREFIX) or not tail.isdigit():
        return None
    return int(tail)


def request_dumps(directory: Path) -> list[int]:
    """Write to every rank's dump FIFO in `directory`; the ranks whose FIFO had a reader."""
    poked = []
    for pipe in sorted(directory.glob(f"{DUMP_PREFIX}*.pipe")):
        rank = _rank_of(pipe.with_suffix(""))
        try:
            if rank is None or not stat.S_ISFIFO(pipe.lstat().st_mode):
                continue
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: nobody reads it (the rank is gone)
            if exc.errno not in (errno.ENXIO, errno.ENOENT):
                log.warning("could not open %s: %s", pipe, exc)
            continue
        try:
            os.write(fd, b"dump\n")
            poked.append(rank)
        except OSError as exc:
            log.warning("could not write to %s: %s", pipe, exc)
        finally:
            os.close(fd)
    return poked


def read_dump(path: Path) -> dict[str, Any] | None:
    """One dump as a dict (pickle or JSON), or None if it is not a readable dump."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode) or path.stat().st_size > MAX_DUMP_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    try:
        value = json.loads(data) if data[:1] == b"{" else _DataOnly(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed or hostile file: no dump
        log.warning("unreadable flight recorder dump %s: %s", path, exc)
        return None
    return value if isinstance(value, dict) else None


def _dump_files(directory: Path, since: float) -> dict[int, Path]:
    files = {}
    for path in directory.glob(f"{DUMP_PREFIX}*"):
        rank = _rank_of(path)
        try:
            if rank is not None and path.stat().st_mtime >= since:
                files[rank] = path
        except OSError:
            continue
    return files


def _sizes(files: dict[int, Path]) -> dict[int, int]:
    sizes = {}
    for rank, path in files.items():
        try:
            sizes[rank] = path.stat().st_size
        except OSError:
            continue
    return sizes


def collect(
    directory: Path, *, since: float, num_ranks: int, timeout_s: float = DUMP_WAIT_S
) -> dict[int, RankTrace]:
    """Ask every rank for a dump and read what arrives within `timeout_s` (global rank
    -> its `RankTrace`: each dump is reduced as it is read, so a large job's dumps
    never sit in memory together). Files older than `since` (an earlier attempt's) and
    ranks at or past `num_ranks` (files a job made up) are ignored."""
    if not directory.is_dir():
        return {}
    asked = time.time()
    poked = request_dumps(directory)
    deadline = time.monotonic() + (timeout_s if poked else 0.0)
    sizes: dict[int, int] = {}
    while True:
        # done when every rank asked has written, and no file grew since the last look
        now_sizes = _sizes(_dump_files(directory, asked))
        if all(r in now_sizes and sizes.get(r) == now_sizes[r] for r in poked):
            break
        if time.monotonic() >= deadline:
            break
        sizes = now_sizes
        time.sleep(_POLL_S)
    traces = {}
    for rank, path in sorted(_dump_files(directory, since).items()):
        if rank >= num_ranks:
            continue
        dump = read_dump(path)
        if dump is not None:
            traces[rank] = summarize(dump)
    return traces


def hang_report(
    attempt_dir: Path, *, num_ranks: int, since: float = 0.0, timeout_s: float = DUMP_WAIT_S
) -> CollectiveDiagnosis | None:
    """The flight recorder's account of a hang in the attempt at `attempt_dir` (None when
    no rank left a dump: not a GPU job, or the dumps are on another machine)."""
    traces = collect(attempt_dir / TRACE_DIR, since=since, num_ranks=num_ranks, timeout_s=timeout_s)
    return diagnose(traces)
