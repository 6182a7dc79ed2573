"""The local cache of remote shards: whole files, a byte budget, LRU eviction.

One cache directory per store URL on a node, shared by every process that reads it
(the node's ranks, their DataLoader workers):

```
<root>/shards/<name>        finished shards, renamed into place after their checksum
<root>/sums/<key>.sha256    the sha256 of each, computed while it was downloaded
<root>/locks/<key>.lock     one lock file per shard (flock), and `.room` for eviction
<root>/tmp/                 downloads in progress (not counted against the budget)
```

A shard in use holds a shared `flock` on its lock file; a download holds it
exclusively, so a shard is fetched once however many threads and processes ask for
it. Eviction takes a shard's lock exclusively without waiting and skips the shard
when it cannot: a shard in use is never evicted. Least recently used means the
oldest mtime (`touch` sets it on every use; atime is not reliable on Linux mounts).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from air_sdk.errors import DataError

__all__ = ["ShardCache", "ShardLock", "format_size"]


def format_size(num_bytes: int) -> str:
    """`1.5 MiB` (what error messages show).

    Example:
        >>> format_size(1536), format_size(3 << 20), format_size(10)
        ('1.5 KiB', '3.0 MiB', '10 B')
    """
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class ShardLock:
    """One shard's lock file, opened by this holder (flock locks belong to an open
    file, so two threads of one process exclude each other as two processes do)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def shared(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    def exclusive(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def try_shared(self) -> bool:
        return self._try(fcntl.LOCK_SH)

    def try_exclusive(self) -> bool:
        return self._try(fcntl.LOCK_EX)

    def _try(self, kind: int) -> bool:
        try:
            fcntl.flock(self._fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        """Release the lock (closing the file does)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class _Entry:
    name: str
    path: Path
    size: int
    mtime: float


class ShardCache:
    """Whole shards under `root`, within `budget_bytes` (None: no limit).

    Example:
        >>> import tempfile
        >>> cache = ShardCache(Path(tempfile.mkdtemp()), budget_bytes=100)
        >>> cache.contains("a.bin"), cache.used_bytes()
        (False, 0)
    """

    def __init__(self, root: Path, budget_bytes: int | None) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.shards = root / "shards"
        self.tmp = root / "tmp"
        for directory in (self.shards, self.tmp, root / "sums", root / "locks"):
            directory.mkdir(parents=True, exist_ok=True)
        self._count_lock = threading.Lock()
        self.num_evictions = 0

    # -- where things are ------------------------------------------------------------------

    def path(self, name: str) -> Path:
        return self.shards / name

    def _key(self, name: str) -> str:
        return hashlib.sha256(name.encode()).hexdigest()[:32]

    def lock(self, name: str) -> ShardLock:
        """An unlocked handle on `name`'s lock file."""
        return ShardLock(self.root / "locks" / f"{self._key(name)}.lock")

    def _sum_path(self, name: str) -> Path:
        return self.root / "sums" / f"{self._key(name)}.sha256"

    # -- what is there ---------------------------------------------------------------------

    def contains(self, name: str, sha256: str | None = None, size: int | None = None) -> bool:
        """Is `name` cached (with this checksum and size, when given)?"""
        try:
            st = self.path(name).stat()
        except FileNotFoundError:
            return False
        if size is not None and st.st_size != size:
            return False
        return sha256 is None or self.checksum(name) == sha256.lower()

    def checksum(self, name: str) -> str | None:
        """The sha256 computed when `name` was downloaded."""
        try:
            return self._sum_path(name).read_text().strip()
        except FileNotFoundError:
            return None

    def touch(self, name: str) -> None:
        """Mark `name` as just used (LRU order). The time is given, not left to the
        kernel: a file's own timestamps tick per jiffy, too coarse to order uses."""
        now = time.time_ns()
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path(name), ns=(now, now))

    def entries(self) -> list[_Entry]:
        """Every cached shard, least recently used first."""
        found: list[_Entry] = []
        for directory, _dirs, files in os.walk(self.shards):
            for file in files:
                path = Path(directory) / file
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue  # evicted by another process meanwhile
                name = path.relative_to(self.shards).as_posix()
                found.append(_Entry(name, path, st.st_size, st.st_mtime))
        return sorted(found, key=lambda e: (e.mtime, e.name))

    def used_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    # -- putting and evicting --------------------------------------------------------------

    @contextlib.contextmanager
    def _room_lock(self) -> Iterator[None]:
        # One process at a time decides what to evict and puts its shard in place, so
        # two cannot both count on the same free bytes.
        lock = ShardLock(self.root / "locks" / ".room")
        try:
            lock.exclusive()
            yield
        finally:
            lock.close()

    def check_fits(self, name: str, size: int) -> None:
        """A `DataError` when `name` alone is larger than the budget."""
        if self.budget_bytes is not None and size > self.budget_bytes:
            raise DataError(
                f"shard {name!r} is {format_size(size)} ({size} bytes); the cache budget is"
                f" {format_size(self.budget_bytes)} ({self.budget_bytes} bytes): raise"
                " cache_budget_bytes above the largest shard (a few shards' worth lets"
                " prefetch work)"
            )

    def put(self, name: str, downloaded: Path, sha256: str) -> None:
        """Move a verified download into place, evicting least recently used shards not
        in use until it fits; a `DataError` when the shards in use leave no room."""
        size = downloaded.stat().st_size
        self.check_fits(name, size)
        with self._room_lock():
            self._make_room(name, size)
            self.path(name).parent.mkdir(parents=True, exist_ok=True)
            self._sum_path(name).write_text(sha256 + "\n")
            os.replace(downloaded, self.path(name))
            self.touch(name)

    def _make_room(self, name: str, size: int) -> None:
        if self.budget_bytes is None:
            return
        entries = [e for e in self.entries() if e.name != name]
        used = sum(e.size for e in entries)
        for entry in entries:
            if used + size <= self.budget_bytes:
                return
            if self._evict(entry):
                used -= entry.size
        if used + size > self.budget_bytes:
            raise DataError(
                f"the cache budget of {format_size(self.budget_bytes)} cannot hold shard"
                f" {name!r} ({format_size(size)}) beside the shards in use"
                f" ({format_size(used)}): raise cache_budget_bytes, or pin fewer shards at"
                " once (fewer DataLoader workers, a smaller prefetch)"
            )

    def _evict(self, entry: _Entry) -> bool:
        lock = self.lock(entry.name)
        try:
            if not lock.try_exclusive():
                return False  # in use (or being fetched): never evicted
            with contextlib.suppress(FileNotFoundError):
                entry.path.unlink()
            with contextlib.suppress(FileNotFoundError):
                self._sum_path(entry.name).unlink()
        finally:
            lock.close()
        with self._count_lock:
            self.num_evictions += 1
        return True
