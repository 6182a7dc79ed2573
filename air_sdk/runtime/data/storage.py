"""Shards where they live: a local directory, or any fsspec URL behind a local cache.

```python
from air_sdk.runtime.data import ShardStore

store = ShardStore("s3://bucket/tokens", cache_budget_bytes=20 << 30)
store.prefetch(["shard-0001.bin", "shard-0002.bin"])      # background downloads
with store.pinned("shard-0000.bin", sha256=digest) as path:
    tokens = numpy.memmap(path, dtype=numpy.uint16, mode="r")
    ...                                                     # never evicted meanwhile
```

A local directory (or a `file://` URL) is read in place: `pinned` yields the file
itself, no copy. Any other URL (`memory://`, `http(s)://`, `s3://` with s3fs, ...)
goes through fsspec: the shard is streamed into the cache's `tmp/`, hashed on the way,
and renamed into place only when its sha256 matches (`ShardChecksumError` names the
shard, the URL and both checksums otherwise). Threads and processes of one node that
ask for the same shard download it once (a file lock per shard, `cache.py`).

The cache keeps whole shards within `cache_budget_bytes`, evicting the least recently
used shard that nobody holds pinned; a shard larger than the whole budget is refused
before it is downloaded (when its size is known) with a message saying what to raise.
The default cache directory is `$AIR_DATA_CACHE`, else `air-data-cache/<job>` under the
temporary directory: in an AIR job that is the job's own `/tmp` on this node, which its
ranks share and its sandbox lets them write.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from air_sdk.errors import DataError, ShardChecksumError
from air_sdk.runtime.data.cache import ShardCache
from air_sdk.runtime.data.metrics import recorder

__all__ = ["ShardStore", "default_cache_dir"]

#: bytes read per call while streaming a shard into the cache
CHUNK_BYTES = 4 << 20


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where a store keeps remote shards unless told: `$AIR_DATA_CACHE`, else
    `<tmp>/air-data-cache/<job id>` (`local` outside a job).

    Example:
        >>> default_cache_dir({"AIR_DATA_CACHE": "/scratch/cache"})
        PosixPath('/scratch/cache')
    """
    from air_sdk.schema.worker_env import WorkerEnv

    worker = WorkerEnv.from_env(os.environ if env is None else env)
    if worker.data_cache:
        return Path(worker.data_cache)
    return Path(tempfile.gettempdir()) / "air-data-cache" / (worker.job_id or "local")


def _check_name(name: str) -> str:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name or "\0" in name:
        raise DataError(
            f"shard name {name!r} must be a relative path under the store's URL (no leading"
            " '/', no '..'): pass the shard's name as the index lists it"
        )
    return path.as_posix()


class ShardStore:
    """Shards under `url`, pinned as local paths while in use (see the module docstring).

    `verify`: hash a local shard against the sha256 given to `pinned` (once per shard
    and process). Off by default: a local file is not copied, and hashing it would read
    it once more; remote shards are always checked while they download.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp()); _ = (root / "a.bin").write_bytes(b"abc")
        >>> with ShardStore(root).pinned("a.bin") as path:
        ...     path.read_bytes()
        b'abc'
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_budget_bytes: int | None = None,
        prefetch: int = 2,
        storage_options: Mapping[str, Any] | None = None,
        verify: bool = False,
    ) -> None:
        if cache_budget_bytes is not None and cache_budget_bytes <= 0:
            raise DataError(
                f"cache_budget_bytes={cache_budget_bytes!r}: pass a positive byte count,"
                " or None for no limit"
            )
        if prefetch < 0:
            raise DataError(f"prefetch={prefetch!r}: pass 0 (no prefetch) or more workers")
        self.url = os.fspath(url)
        self.verify = verify
        self.num_prefetch_workers = prefetch
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("hits", "misses", "bytes_downloaded", "prefetched", "prefetch_skipped"), 0
        )
        self._wait_s = 0.0
        self._verified: set[str] = set()
        self._inflight: dict[str, Future[None]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self.local_root: Path | None = None
        self._fs: Any = None
        self._cache: ShardCache | None = None
        if "://" not in self.url or self.url.startswith("file://"):
            self.local_root = Path(self.url.removeprefix("file://"))
            if not self.local_root.is_dir():
                raise DataError(
                    f"the shard directory {self.local_root} does not exist: check the"
                    " store's path (or give a remote URL such as s3://bucket/prefix)"
                )
            return
        import fsspec

        try:
            self._fs, self._root = fsspec.core.url_to_fs(self.url, **dict(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise DataError(
                f"cannot read shards from {self.url}: {exc} (install the fsspec"
                " implementation for this protocol, e.g. s3fs for s3://)"
            ) from exc
        base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        url_key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self._cache = ShardCache(base / url_key, cache_budget_bytes)

    @property
    def cache(self) -> ShardCache | None:
        """The local cache (None for a local directory, read in place)."""
        return self._cache

    def shard_url(self, name: str) -> str:
        """Where shard `name` is read from."""
        if self.local_root is not None:
            return str(self.local_root / name)
        return self.url.rstrip("/") + "/" + name

    def read_small(self, name: str) -> bytes:
        """The bytes of a small file beside the shards (`index.json`), read where it lives,
        never cached (a cached index would go stale when the shards are indexed again)."""
        name = _check_name(name)
        if self.local_root is not None:
            return (self.local_root / name).read_bytes()
        try:
            data: bytes = self._fs.cat_file(f"{self._root.rstrip('/')}/{name}")
        except FileNotFoundError:
            raise FileNotFoundError(self.shard_url(name)) from None
        return data

    # -- pinning ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def pinned(
        self, name: str, sha256: str | None = None, size: int | None = None
    ) -> Iterator[Path]:
        """A local path of shard `name`, kept (never evicted) until the block ends.

        A remote shard is downloaded first unless cached (with this `sha256` and
        `size`, when given); the time that takes counts as the loop waiting for this
        shard. A checksum mismatch raises `ShardChecksumError`.
        """
        name = _check_name(name)
        if self._cache is None:
            yield self._local(name, sha256)
            return
        lock = self._cache.lock(name)
        try:
            hit = self._acquire(name, sha256, size, lock)
            self._cache.touch(name)
            recorder().record_cache(hit)
            with self._lock:
                self._counts["hits" if hit else "misses"] += 1
            yield self._cache.path(name)
        finally:
            lock.close()

    def _local(self, name: str, sha256: str | None) -> Path:
        assert self.local_root is not None
        path = self.local_root / name
        if not path.is_file():
            raise DataError(
                f"shard {name!r} is not at {path}: check the name against the index and the"
                " store's directory"
            )
        if self.verify and sha256 and name not in self._verified:
            digest = hashlib.sha256()
            with path.open("rb") as file:
                while chunk := file.read(CHUNK_BYTES):
                    digest.update(chunk)
            _check_sum(name, path.as_uri(), sha256, digest.hexdigest())
            self._verified.add(name)
        return path

    def _acquire(self, name: str, sha256: str | None, size: int | None, lock: Any) -> bool:
        """Leave `lock` held shared with the shard in place; True when it was there."""
        assert self._cache is not None
        with self._lock:
            self._forget_threads_after_fork()
            prefetch = self._inflight.pop(name, None)
        if prefetch is not None and prefetch.done():
            _raise_corrupt(prefetch)
            prefetch = None
        if prefetch is None and lock.try_shared() and self._cache.contains(name, sha256, size):
            return True  # the fast path: no wait to record
        started = time.monotonic()
        try:
            with recorder().waiting(shard=name):
                if prefetch is not None:
                    # Its download is queued or under way: wait for it rather than fetch
                    # the shard a second time (flock would make us wait anyway).
                    futures.wait([prefetch])
                    _raise_corrupt(prefetch)
                return self._acquire_slowly(name, sha256, size, lock)
        finally:
            with self._lock:
                self._wait_s += time.monotonic() - started

    def _acquire_slowly(self, name: str, sha256: str | None, size: int | None, lock: Any) -> bool:
        assert self._cache is not None
        downloaded = False
        while True:
            lock.shared()  # waits while another thread or process downloads it
            if self._cache.contains(name, sha256, size):
                return not downloaded
            lock.exclusive()
            if not self._cache.contains(name, sha256, size):
                self._download(name, sha256, size)
                downloaded = True
            # Back to shared and look again: eviction may slip into the conversion.

    # -- prefetch --------------------------------------------------------------------------

    def prefetch(
        self,
        names: Iterable[str],
        *,
        checksums: Mapping[str, str] | None = None,
        sizes: Mapping[str, int] | None = None,
    ) -> list[Future[None]]:
        """Start downloading `names` in the background (`prefetch` threads), skipping
        shards already cached or on their way; returns the downloads started. A shard
        for which the budget has no room now is skipped, not forced in.

        Example:
            >>> import tempfile
            >>> ShardStore(tempfile.mkdtemp()).prefetch(["a.bin"])  # local: nothing to fetch
            []
        """
        if self._cache is None or self.num_prefetch_workers == 0:
            return []
        started: list[Future[None]] = []
        with self._lock:
            self._forget_threads_after_fork()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.num_prefetch_workers, thread_name_prefix="air-prefetch"
                )
            for name in map(_check_name, names):
                known = self._inflight.get(name)
                if (known is not None and not known.done()) or self._cache.contains(name):
                    continue
                sha = (checksums or {}).get(name)
                size = (sizes or {}).get(name)
                future = self._pool.submit(self._prefetch_one, name, sha, size)
                self._inflight[name] = future
                started.append(future)
        return started

    def _forget_threads_after_fork(self) -> None:
        # A forked DataLoader worker: the parent's threads and their downloads stayed
        # behind, and their futures would never finish here. (Caller holds _lock.)
        if self._pid != os.getpid():
            self._pool, self._inflight, self._pid = None, {}, os.getpid()

    def _prefetch_one(self, name: str, sha256: str | None, size: int | None) -> None:
        assert self._cache is not None
        lock = self._cache.lock(name)
        try:
            if lock.try_shared() and self._cache.contains(name, sha256, size):
                return
            lock.exclusive()
            if self._cache.contains(name, sha256, size):
                return
            try:
                self._download(name, sha256, size)
            except DataError as exc:
                if isinstance(exc, ShardChecksumError) or "cache budget" not in str(exc):
                    raise  # the pin will raise it too, with the same words
                with self._lock:
                    self._counts["prefetch_skipped"] += 1
                return
            with self._lock:
                self._counts["prefetched"] += 1
        finally:
            lock.close()

    # -- downloading -----------------------------------------------------------------------

    def _remote(self, name: str) -> str:
        return self._root.rstrip("/") + "/" + name

    def _download(self, name: str, sha256: str | None, size: int | None) -> None:
        """Stream `name` into the cache (the caller holds its lock exclusively)."""
        assert self._cache is not None
        url = self.shard_url(name)
        remote = self._remote(name)
        if size is None:
            with contextlib.suppress(Exception):  # a server that does not say: found below
                size = self._fs.size(remote)
        if size is not None:
            self._cache.check_fits(name, size)
        budget = self._cache.budget_bytes
        # Streamed: HTTP servers need not take range requests, and a shard is read once.
        options = {"block_size": 0} if "http" in _protocols(self._fs) else {}
        digest = hashlib.sha256()
        fd, tmp_name = tempfile.mkstemp(dir=self._cache.tmp, prefix="dl-")
        tmp = Path(tmp_name)
        try:
            num_bytes = 0
            try:
                with self._fs.open(remote, "rb", **options) as src, os.fdopen(fd, "wb") as dst:
                    while chunk := src.read(CHUNK_BYTES):
                        digest.update(chunk)
                        dst.write(chunk)
                        num_bytes += len(chunk)
                        if budget is not None and num_bytes > budget:
                            self._cache.check_fits(name, num_bytes)
            except FileNotFoundError as exc:
                raise DataError(
                    f"shard {name!r} is not at {url}: check the name against the index and"
                    " the store's URL"
                ) from exc
            except DataError:
                raise
            except Exception as exc:
                raise DataError(f"could not fetch shard {name!r} from {url}: {exc!r}") from exc
            actual = digest.hexdigest()
            if sha256 is not None:
                _check_sum(name, url, sha256, actual)
            if size is not None and num_bytes != size:
                raise DataError(
                    f"shard {name!r} from {url} has {num_bytes} bytes; the index says {size}:"
                    " the shard or the index is out of date"
                )
            self._cache.put(name, tmp, actual)
            with self._lock:
                self._counts["bytes_downloaded"] += num_bytes
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    # -- accounting ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Pins served from the cache (`hits`) and downloaded first (`misses`),
        `bytes_downloaded`, `bytes_cached` (on disk now, every process of the node),
        `wait_s` (time `pinned` blocked on downloads), `evictions`, `prefetched` and
        `prefetch_skipped` (no room in the budget).

        Example:
            >>> import tempfile
            >>> ShardStore(tempfile.mkdtemp()).stats()["hits"]
            0
        """
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            out["wait_s"] = self._wait_s
        cache = self._cache
        out["bytes_cached"] = cache.used_bytes() if cache is not None else 0
        out["evictions"] = cache.num_evictions if cache is not None else 0
        return out

    def close(self) -> None:
        """Wait for the prefetches under way and stop their threads."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        budget = self._cache.budget_bytes if self._cache is not None else None
        shown = f", cache_budget_bytes={budget}" if budget is not None else ""
        return f"ShardStore({self.url!r}{shown})"


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _raise_corrupt(prefetch: Future[None]) -> None:
    """Raise a finished prefetch's checksum error: the shard is corrupt where it lives,
    and fetching it again would say the same. Other failures (a dropped connection) are
    left to the pin, which downloads the shard itself and raises its own error."""
    if prefetch.cancelled():
        return
    error = prefetch.exception()
    if isinstance(error, ShardChecksumError):
        raise error


def _check_sum(name: str, url: str, expected: str, actual: str) -> None:
    if actual != expected.lower():
        raise ShardChecksumError(
            f"shard {name!r} is corrupt: its sha256 is {actual}, the index expects"
            f" {expected.lower()} (read from {url}); nothing of it was cached. Re-upload the"
            " shard or rebuild the index"
        )
