"""Where checkpoints live: a small Protocol with a local and an fsspec implementation.

The checkpointer only ever lists, reads, hashes, renames and removes through a
`CheckpointStorage`, and asks it for the DCP writer/reader of one directory, so a
new backend is one class. `storage_for("s3://bucket/run")` picks fsspec (torch
depends on it, so it is there wherever DCP is); a plain path picks `LocalStorage`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageReader, StorageWriter

__all__ = ["CheckpointStorage", "FsspecStorage", "LocalStorage", "storage_for"]

_CHUNK = 1 << 20


@runtime_checkable
class CheckpointStorage(Protocol):
    """The file operations a checkpointer needs; paths are strings under `root`."""

    root: str

    def join(self, *parts: str) -> str:
        """`root`-style path of `parts` (the first may already be a full path)."""
        ...

    def list_dir(self, path: str) -> list[str]:
        """Names directly under `path`; empty when it does not exist."""
        ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int:
        """Bytes in a file; FileNotFoundError when there is none."""
        ...

    def digest(self, path: str) -> tuple[int, str]:
        """(size, sha256 hex) of a file, read in chunks."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write `path.tmp`, make it durable, rename it to `path`, make the rename durable."""
        ...

    def make_dirs(self, path: str) -> None: ...

    def sync_dir(self, path: str) -> None:
        """Make a directory's entries durable (no-op where the store has no such notion)."""
        ...

    def move(self, src: str, dst: str) -> None: ...

    def remove_file(self, path: str) -> None:
        """Remove a file if it exists."""
        ...

    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything in it, if it exists."""
        ...

    def writer(self, path: str) -> StorageWriter:
        """A DCP StorageWriter for the checkpoint directory `path` (fsyncs its files)."""
        ...

    def reader(self, path: str) -> StorageReader: ...


class LocalStorage:
    """Checkpoints in a local (or network-mounted) directory.

    Example:
        >>> storage = LocalStorage("/tmp/air-ckpt")
        >>> storage.join(storage.root, "step-10")
        '/tmp/air-ckpt/step-10'
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def digest(self, path: str) -> tuple[int, str]:
        with open(path, "rb") as f:
            # file_digest hashes with the GIL released: training threads keep running.
            sha = hashlib.file_digest(f, "sha256").hexdigest()
            return f.tell(), sha

    def read_bytes(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.sync_dir(os.path.dirname(path))

    def make_dirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def sync_dir(self, path: str) -> None:
        _fsync_dir(path)

    def move(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove_file(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def writer(self, path: str) -> StorageWriter:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(path, sync_files=True)

    def reader(self, path: str) -> StorageReader:
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(path)


class FsspecStorage:
    """Checkpoints under an fsspec URL (`s3://`, `gs://`, `memory://`, `file://` ...).

    Object stores have no fsync or atomic rename of directories: durability is
    the store's on close, and the manifest is a single object written last.

    Example:
        >>> FsspecStorage("memory://runs/1").root
        'memory://runs/1'
    """

    def __init__(self, url: str, **options: Any) -> None:
        try:
            from fsspec.core import url_to_fs
        except ImportError as exc:  # pragma: no cover - torch depends on fsspec
            raise ImportError(f"checkpoints at {url!r} need fsspec: pip install fsspec") from exc
        self.root = url.rstrip("/")
        self._options = options
        self.fs, _ = url_to_fs(url, **options)
        self._local = "file" in _protocols(self.fs)

    def join(self, *parts: str) -> str:
        return "/".join(part.rstrip("/") for part in parts)

    def list_dir(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def digest(self, path: str) -> tuple[int, str]:
        sha, size = hashlib.sha256(), 0
        with self.fs.open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
                size += len(chunk)
        return size, sha.hexdigest()

    def read_bytes(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path))

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def make_dirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def sync_dir(self, path: str) -> None:
        if self._local:
            _fsync_dir(self.fs._strip_protocol(path))

    def move(self, src: str, dst: str) -> None:
        self.fs.mv(src, dst, recursive=True)

    def remove_file(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path)

    def remove_tree(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def writer(self, path: str) -> StorageWriter:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        # DCP falls back to a machine-wide os.sync() where a stream has no fileno.
        return FsspecWriter(path, sync_files=self._local, **self._options)

    def reader(self, path: str) -> StorageReader:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(path, **self._options)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def storage_for(location: str | os.PathLike[str]) -> CheckpointStorage:
    """LocalStorage for a path, FsspecStorage for a URL with a scheme.

    Example:
        >>> type(storage_for("/data/ckpt")).__name__, type(storage_for("memory://x")).__name__
        ('LocalStorage', 'FsspecStorage')
    """
    text = os.fspath(location)
    if "://" in text:
        return FsspecStorage(text)
    return LocalStorage(text)
