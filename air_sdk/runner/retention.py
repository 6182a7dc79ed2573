"""Retention of ended jobs' files: which go (a policy), and going (`collect_garbage`).

A job's directory under the gateway's home holds its code (hard links into the
shared bundle cache, `air_sdk.bundle.cache`), its attempts' logs and exit records,
and, unless the job named another place, its checkpoints. Once the job has ended
and is older than `RetentionPolicy.max_age_s`, or the ended jobs' files together
pass `max_bytes` (oldest first), the directory goes, except its `checkpoints/`:
a committed checkpoint is the user's work (`air checkpoints export` reads it), so
it goes only with `include_checkpoints=True`. The job's record, events, logs and
metrics stay in the database (`air status`, `air logs` still answer).
An unpacked bundle goes once no job links its files; an uploaded archive
(`<home>/bundles/`) once no job that has not ended names it. A job's output directory
(`<home>/outputs/<job>`, `air_sdk.runner.outputs`) lies outside `jobs/` and is
never collected.

Bytes are counted as `du` counts them: a file's blocks once, however many links it
has, and freed only with its last link.

Example:
    >>> policy = RetentionPolicy(max_age_s=86400, max_bytes=None)
    >>> old, new = EndedJob("a", ended_at=0, path=Path("/a"), bytes=10), EndedJob(
    ...     "b", ended_at=90000, path=Path("/b"), bytes=10)
    >>> [j.job_id for j in policy.select([old, new], now=100000)]
    ['a']
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from air_sdk.schema import TERMINAL_STATES, GcJob, GcReport

if TYPE_CHECKING:
    from air_sdk.bundle.cache import BundleCache
    from air_sdk.store import SqliteStore

__all__ = ["EndedJob", "RetentionPolicy", "collect_garbage", "disk_usage", "unused_archives"]

log = logging.getLogger(__name__)

_Inode = tuple[int, int]


@dataclass(frozen=True)
class EndedJob:
    """An ended job's directory and the bytes only it holds."""

    job_id: str
    ended_at: float
    path: Path
    bytes: int


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """Which ended jobs' files go.

    Example:
        >>> jobs = [EndedJob(str(i), ended_at=i, path=Path(str(i)), bytes=100) for i in range(3)]
        >>> [j.job_id for j in RetentionPolicy(max_age_s=None, max_bytes=150).select(jobs, now=9)]
        ['0', '1']
    """

    #: files of jobs that ended longer ago than this go; None: no age limit
    max_age_s: float | None = 7 * 86400
    #: the ended jobs' files together stay under this, the oldest going first; None: no cap
    max_bytes: int | None = None
    #: also delete the checkpoints kept under the job's directory (default: keep them)
    include_checkpoints: bool = False

    def __post_init__(self) -> None:
        if self.max_age_s is not None and self.max_age_s < 0:
            raise ValueError(f"max_age_s={self.max_age_s}: give 0 or more seconds, or None")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"max_bytes={self.max_bytes}: give 0 or more bytes, or None")

    def select(self, ended: Sequence[EndedJob], *, now: float) -> list[EndedJob]:
        """The jobs whose files go, oldest first."""
        oldest_first = sorted(ended, key=lambda j: (j.ended_at, j.job_id))
        going = [
            j
            for j in oldest_first
            if self.max_age_s is not None and now - j.ended_at > self.max_age_s
        ]
        if self.max_bytes is not None:
            kept = [j for j in oldest_first if j not in going]
            total = sum(j.bytes for j in kept)
            for job in kept:
                if total <= self.max_bytes:
                    break
                going.append(job)
                total -= job.bytes
        return sorted(going, key=lambda j: (j.ended_at, j.job_id))


def _files(root: Path) -> Iterable[os.stat_result]:
    """lstat of every file (not directory) under `root`, or of `root` if it is a file."""
    if root.is_file():
        yield os.lstat(root)
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (
            *filenames,
            *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))),
        ):
            try:
                yield os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue


def _links(roots: Iterable[Path]) -> tuple[Counter[_Inode], dict[_Inode, os.stat_result]]:
    """How many links under `roots` each inode has, and a stat of each."""
    counts: Counter[_Inode] = Counter()
    stats: dict[_Inode, os.stat_result] = {}
    for root in roots:
        for st in _files(root):
            key = (st.st_dev, st.st_ino)
            counts[key] += 1
            stats[key] = st
    return counts, stats


def _bytes(st: os.stat_result) -> int:
    return st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size


def disk_usage(roots: Iterable[Path]) -> int:
    """Bytes on disk under `roots`, each file's blocks once (as `du` counts them).

    Example:
        >>> import tempfile
        >>> disk_usage([Path(tempfile.mkdtemp())])
        0
    """
    _, stats = _links(roots)
    return sum(_bytes(st) for st in stats.values())


def _freed(counts: Counter[_Inode], stats: dict[_Inode, os.stat_result]) -> int:
    """Bytes that leave the disk when every link counted goes (a file's last link)."""
    return sum(_bytes(stats[k]) for k, n in counts.items() if n >= stats[k].st_nlink)


#: the part of a job's directory that retention keeps unless told otherwise
CHECKPOINTS_DIR = "checkpoints"


def _going(path: Path, include_checkpoints: bool) -> list[Path]:
    """What of a job's directory goes: all of it, or all but its checkpoints (all of it
    when it holds no checkpoint)."""
    kept = path / CHECKPOINTS_DIR
    if include_checkpoints or not (kept.is_dir() and any(kept.iterdir())):
        return [path]
    return sorted(p for p in path.iterdir() if p.name != CHECKPOINTS_DIR)


def ended_jobs(
    store: SqliteStore, jobs_dir: Path, *, include_checkpoints: bool = False
) -> list[EndedJob]:
    """Ended jobs that still have files to free under `jobs_dir`."""
    found = []
    for job in store.list_jobs(states=tuple(TERMINAL_STATES), limit=1_000_000):
        path = jobs_dir / job.id
        if not path.is_dir():
            continue
        going = _going(path, include_checkpoints)
        if going:
            ended = job.ended_at if job.ended_at is not None else job.updated_at
            counts, stats = _links(going)
            found.append(EndedJob(job.id, ended, path, _freed(counts, stats)))
    return found


#: an uploaded archive younger than this is kept even when no job names it yet: the
#: client uploads first and submits after
ARCHIVE_GRACE_S = 600.0


def unused_archives(
    store: SqliteStore, bundles_dir: Path | None, *, now: float
) -> list[tuple[Path, str, int]]:
    """Uploaded bundle archives (`<home>/bundles/<sha256>.tar.gz`) that no job that has
    not ended names, older than `ARCHIVE_GRACE_S`: (path, sha256, bytes). A later
    submit of the same tree uploads it again (the client asks first)."""
    if bundles_dir is None or not bundles_dir.is_dir():
        return []
    live = {
        job.spec.bundle_sha256
        for job in store.list_jobs(limit=1_000_000)
        if job.state not in TERMINAL_STATES and job.spec.bundle_sha256
    }
    found = []
    for path in sorted(bundles_dir.glob("*.tar.gz")):
        sha = path.name.removesuffix(".tar.gz")
        try:
            st = path.lstat()
        except OSError:
            continue
        if sha in live or not stat.S_ISREG(st.st_mode) or now - st.st_mtime < ARCHIVE_GRACE_S:
            continue
        found.append((path, sha, st.st_blocks * 512))
    return found


def collect_garbage(
    store: SqliteStore,
    jobs_dir: Path,
    cache: BundleCache,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    now: float | None = None,
    bundles_dir: Path | None = None,
) -> GcReport:
    """Delete (or, in a dry run, only count) the files of the ended jobs `policy`
    selects, then the unpacked bundles no job links any more, and the uploaded
    archives in `bundles_dir` no job that has not ended names (`unused_archives`).

    Example:
        >>> report = collect_garbage(store, home / "jobs", cache, RetentionPolicy())  # doctest: +SKIP
        >>> report.bytes_freed  # doctest: +SKIP
        419430400
    """
    from air_sdk.bundle.cache import remove_tree

    now = time.time() if now is None else now
    include = policy.include_checkpoints
    ended = ended_jobs(store, jobs_dir, include_checkpoints=include)
    going = policy.select(ended, now=now)
    counts, stats = _links(p for j in going for p in _going(j.path, include))
    unused: list[tuple[BundleCache, str]] = []
    for one in cache.with_tenants():  # the tenants' caches under it too
        for tree in one.entries():
            tree_counts, tree_stats = _links(one.paths_of(tree.name))
            # every link of its files is in the tree itself or in a job directory that goes
            if all(
                n + counts.get(k, 0) >= tree_stats[k].st_nlink
                for k, n in tree_counts.items()
                if stat.S_ISREG(tree_stats[k].st_mode)
            ):
                unused.append((one, tree.name))
                counts.update(tree_counts)
                stats.update(tree_stats)
    freed = _freed(counts, stats)
    archives = unused_archives(store, bundles_dir, now=now)
    freed += sum(size for _, _, size in archives)
    if not dry_run:
        for path, _, _ in archives:
            path.unlink(missing_ok=True)
        for job in going:
            for part in _going(job.path, include):
                remove_tree(part)
            log.info("removed the files of %s (ended %.0f s ago)", job.job_id, now - job.ended_at)
        unused = [(one, sha) for one, sha in unused if one.remove_unused(sha)]
    going_ids = {j.job_id for j in going}
    return GcReport(
        dry_run=dry_run,
        jobs=[GcJob(job_id=j.job_id, ended_at=j.ended_at, bytes=j.bytes) for j in going],
        bundles=[sha for _, sha in unused],
        archives=[sha for _, sha, _ in archives],
        bytes_freed=freed,
        bytes_kept=sum(j.bytes for j in ended if j.job_id not in going_ids),
    )
