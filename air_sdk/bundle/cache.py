"""Unpacked bundles shared by content hash, and each job's code directory built from one.

A bundle is unpacked once per sha256 into `<cache>/<sha256>/`, its files made
read-only. A job's code directory is a tree of its own (writable) directories
whose files are hard links to the cached ones: ranks start there and write
relative outputs there as before, but the bundle's bytes are on disk once however
many jobs run it (two jobs of a 400 MB bundle: 400 MB, not 800 MB). A file the
job wants to change is replaced (written to a new name and renamed, or deleted and
written anew), never written in place: the cached files are read-only, so an
in-place write fails with PermissionError instead of changing other jobs' code.

A process running as root ignores those permission bits: before a cached tree is
linked again its files are checked against what was unpacked (size and mtime,
recorded at unpack), and a changed tree is unpacked afresh for the next job.

The gateway keeps one cache per tenant (`BundleCache.for_tenant`): a job can
write a linked file in place anyway (its ranks run as the gateway's user, who owns
the files), so files are shared only among one tenant's jobs, never across tenants.

Hard links need one filesystem; where a link cannot be made (another device, the
link limit) the file is copied instead. The link count is the cache's reference
count: a cached tree whose files have no other link is used by no job and may go
(`air gc`).

Example:
    >>> import tempfile
    >>> from air_sdk.bundle import pack_directory
    >>> home = Path(tempfile.mkdtemp())
    >>> bundle = pack_directory(home, extra_files={"train.py": b"print('hi')"})
    >>> archive = home / "b.tar.gz"; _ = archive.write_bytes(bundle.data)
    >>> cache = BundleCache(home / "code-cache")
    >>> a = cache.materialize(bundle.sha256, archive, home / "job-a")
    >>> b = cache.materialize(bundle.sha256, archive, home / "job-b")
    >>> (a / "train.py").stat().st_ino == (b / "train.py").stat().st_ino
    True
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from air_sdk.bundle.unpack import unpack_bundle
from air_sdk.errors import BundleError

__all__ = ["BundleCache", "make_writable", "remove_tree"]

#: written beside each cached tree: {relative path: [size, mtime_ns]} of its files
_MANIFEST_SUFFIX = ".files.json"
_READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_EXEC_BITS = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
#: the cached directories: readable and enterable, nothing can be added to them
_READ_ONLY_DIR = 0o555
_LINK_FALLBACK_ERRNOS = frozenset({errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP})

_locks_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}


#: where the per-tenant caches live under a cache's root (`BundleCache.for_tenant`)
TENANTS_DIR = "tenants"


class BundleCache:
    """Bundles unpacked once per sha256 under `root` (see the module docstring).

    Example:
        >>> BundleCache(Path("/srv/air/code-cache")).tree("ab" * 32).name[:4]
        'abab'
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def for_tenant(self, tenant: str) -> BundleCache:
        """The cache of one tenant's bundles (`<root>/tenants/<tenant>`): jobs of one
        tenant share the files of a bundle, jobs of different tenants never do. A job's
        ranks run as the gateway's user and may write a linked file in place (the
        read-only bit does not stop its owner, nor root); that changes only the code of
        the same tenant's jobs.

        Example:
            >>> BundleCache(Path("/srv/air/code-cache")).for_tenant("team-a").root.parts[-2:]
            ('tenants', 'team-a')
        """
        return BundleCache(self.root / TENANTS_DIR / tenant)

    def with_tenants(self) -> list[BundleCache]:
        """This cache and every tenant's cache under it (for `air gc`)."""
        tenants = self.root / TENANTS_DIR
        found = sorted(p for p in tenants.iterdir() if p.is_dir()) if tenants.is_dir() else []
        return [self, *(BundleCache(p) for p in found)]

    def tree(self, sha256: str) -> Path:
        """Where bundle `sha256` is (or would be) unpacked."""
        return self.root / sha256

    def unpacked(self, sha256: str, archive: Path) -> Path:
        """The read-only unpacked tree of bundle `sha256`, unpacking `archive` (checked
        against the sha256) the first time, or again when a cached file was changed."""
        with self._locked(sha256):
            return self._ensure(sha256, archive)

    def materialize(self, sha256: str, archive: Path, dest: Path) -> Path:
        """A job's code directory `dest` (which must not exist): its own directories, the
        bundle's files hard-linked from the cache (copied where a link cannot be made).
        The directory appears whole or not at all."""
        if dest.exists():
            raise BundleError(f"cannot build the job's code in {dest}: it exists already")
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = dest.parent / f".{dest.name}.linking-{os.getpid()}"
        remove_tree(staging)
        with self._locked(sha256):  # `remove_unused` cannot take the tree meanwhile
            source = self._ensure(sha256, archive)
            try:
                _link_tree(source, staging)
                os.rename(staging, dest)
            except BaseException:
                remove_tree(staging)
                raise
        return dest

    def paths_of(self, sha256: str) -> list[Path]:
        """Everything the cache keeps for one bundle: its tree and its bookkeeping."""
        paths = [self.tree(sha256), self.root / (sha256 + _MANIFEST_SUFFIX)]
        return [p for p in paths if p.exists()]

    def in_use(self, sha256: str) -> bool:
        """Whether any job's code still links a file of the cached tree."""
        for dirpath, _, filenames in os.walk(self.tree(sha256)):
            for name in filenames:
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    return True
        return False

    def remove_unused(self, sha256: str) -> bool:
        """Remove the cached tree if no job links its files (checked under the lock a
        job's `materialize` takes); True when it went."""
        with self._locked(sha256):
            if self.in_use(sha256):
                return False
            remove_tree(self.tree(sha256))
            # the (empty) lock file stays: another process may be waiting on it
            (self.root / (sha256 + _MANIFEST_SUFFIX)).unlink(missing_ok=True)
        return True

    def entries(self) -> list[Path]:
        """Every cached tree."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and len(p.name) == 64)

    # -- internals -----------------------------------------------------------------------

    def _ensure(self, sha256: str, archive: Path) -> Path:
        tree = self.tree(sha256)
        if tree.is_dir() and self._intact(sha256):
            return tree
        if tree.exists():
            remove_tree(tree)  # changed by a root process: never hand it out again
        unpack_bundle(archive, tree, expected_sha256=sha256)
        self._seal(sha256)
        return tree

    @contextlib.contextmanager
    def _locked(self, sha256: str) -> Iterator[None]:
        """One unpacker per bundle: threads of this gateway, and other processes."""
        with _locks_guard:
            thread_lock = _thread_locks.setdefault(str(self.tree(sha256)), threading.Lock())
        with thread_lock:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / f".{sha256}.lock", "a") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _seal(self, sha256: str) -> None:
        """Make the tree read-only and record what it holds."""
        tree = self.tree(sha256)
        files: dict[str, list[int]] = {}
        dirs = []
        for dirpath, _, filenames in os.walk(tree):
            dirs.append(dirpath)
            for name in filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    os.chmod(path, _READ_ONLY_FILE | (st.st_mode & _EXEC_BITS))
                    st = os.lstat(path)
                    files[os.path.relpath(path, tree)] = [st.st_size, st.st_mtime_ns]
        for dirpath in reversed(dirs):  # deepest first: a sealed parent still lets us in
            os.chmod(dirpath, _READ_ONLY_DIR)
        manifest = self.root / (sha256 + _MANIFEST_SUFFIX)
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(files))
        os.replace(tmp, manifest)

    def _intact(self, sha256: str) -> bool:
        """The cached files are as unpacked (a stat per file, no reading)."""
        tree = self.tree(sha256)
        try:
            files = json.loads((self.root / (sha256 + _MANIFEST_SUFFIX)).read_text())
        except (OSError, ValueError):
            return False
        try:
            for rel, (size, mtime_ns) in files.items():
                st = os.lstat(tree / rel)
                if (st.st_size, st.st_mtime_ns) != (size, mtime_ns) or st.st_mode & 0o222:
                    return False
        except OSError:
            return False
        return True


def _link_tree(source: Path, dest: Path) -> None:
    """`dest` as a copy of `source` whose directories are new and writable and whose
    files are hard links (copies where linking fails); symlinks are made anew."""
    dest.mkdir(mode=0o755)
    for dirpath, dirnames, filenames in os.walk(source):
        rel = os.path.relpath(dirpath, source)
        target_dir = dest if rel == "." else dest / rel
        for name in list(dirnames):
            src_dir = os.path.join(dirpath, name)
            if os.path.islink(src_dir):  # a link to a directory inside the bundle
                os.symlink(os.readlink(src_dir), target_dir / name)
                dirnames.remove(name)
            else:
                (target_dir / name).mkdir(mode=0o755)
        for name in filenames:
            src = os.path.join(dirpath, name)
            dst = target_dir / name
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            try:
                os.link(src, dst)
            except OSError as exc:
                if exc.errno not in _LINK_FALLBACK_ERRNOS:
                    raise
                shutil.copy2(src, dst)


def make_writable(path: Path) -> None:
    """Give the owner write access to `path`'s directories, so its files can be removed."""
    if not path.exists() or path.is_symlink():
        return
    for dirpath, _, _ in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, os.lstat(dirpath).st_mode | stat.S_IWUSR | stat.S_IXUSR)


def remove_tree(path: Path) -> None:
    """Remove `path` and everything under it, read-only directories included."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return
    if not path.exists():
        return
    make_writable(path)
    shutil.rmtree(path, ignore_errors=True)
