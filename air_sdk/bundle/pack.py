"""Packing a project directory into a deterministic, content-addressed tar.gz.

The same files give the same bytes, and so the same sha256, wherever the tree
lives and whatever its timestamps or owners: members are sorted, paths are
POSIX and relative, mtimes and owners are zeroed, modes are 0o644 or 0o755,
and the gzip header carries no name or time. That lets the client skip the
upload of a bundle the gateway already has.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from air_sdk.bundle.unpack import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    _canonical,
    _human_bytes,
    _unsafe_name_reason,
    bundle_bytes_sha256,
)
from air_sdk.errors import BundleError, BundleTooLargeError, UnsafeBundleError

__all__ = [
    "DEFAULT_IGNORES",
    "SCAN_REPORT_EVERY",
    "Bundle",
    "Scan",
    "pack_directory",
    "pack_scan",
    "scan_directory",
]

#: Always left out, whatever the ignore files say.
DEFAULT_IGNORES: tuple[str, ...] = (
    ".git",
    ".hg/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    ".ipynb_checkpoints/",
    ".air/",
)

_Patterns = Sequence[pathspec.Pattern]
_DEFAULT_PATTERNS: _Patterns = pathspec.GitIgnoreSpec.from_lines(DEFAULT_IGNORES).patterns
# Stop stat-ing a runaway tree (a dataset, node_modules) well past the limit:
# enough to say where the files are, without walking millions of them.
_WALK_CAP_FACTOR = 10
#: how often (in files found) scanning a tree reports its progress
SCAN_REPORT_EVERY = 500
_GZIP_LEVEL = 6
#: how often packing a large file reports its progress
_HEARD_EVERY = 4 << 20


@dataclass(frozen=True)
class Bundle:
    """A packed project: the tar.gz bytes and what they hold.

    Example:
        >>> import tempfile
        >>> project = Path(tempfile.mkdtemp())
        >>> for name in ("train.py", "data.py"):
        ...     _ = (project / name).write_text("x = 1")
        >>> bundle = pack_directory(project)
        >>> bundle.num_files, bundle.files, len(bundle.sha256)
        (2, ('data.py', 'train.py'), 64)
    """

    data: bytes = field(repr=False)
    """The tar.gz itself."""
    sha256: str
    """Hex sha256 of `data`: the bundle's content address."""
    size: int
    """Uncompressed bytes of file content (what the limits count)."""
    num_files: int
    """How many files the bundle holds."""
    files: tuple[str, ...]
    """POSIX paths of the files, relative to the root, sorted."""


@dataclass(frozen=True)
class _Entry:
    name: str
    source: str | None  # file to read (a link's target), or None for an extra file
    size: int
    executable: bool
    mtime_ns: int = 0


@dataclass(frozen=True)
class Scan:
    """What a bundle of a directory would hold, found by stat alone (nothing read):
    its `fingerprint` is the same while no kept file changed its name, size, mode or
    mtime, so an unchanged tree need not be packed again.

    Example:
        >>> import tempfile
        >>> project = Path(tempfile.mkdtemp()); _ = (project / "train.py").write_text("x")
        >>> scan_directory(project).fingerprint == scan_directory(project).fingerprint
        True
    """

    entries: tuple[_Entry, ...] = field(repr=False)
    extras: Mapping[str, bytes] = field(repr=False)

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for e in self.entries:
            content = self.extras.get(e.name) if e.source is None else None
            said = hashlib.sha256(content).hexdigest() if content is not None else e.source
            digest.update(f"{e.name}\0{said}\0{e.size}\0{e.mtime_ns}\0{e.executable}\n".encode())
        return digest.hexdigest()


def scan_directory(
    root: Path,
    *,
    extra_files: Mapping[str, bytes] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
    on_scan: Callable[[int, int], None] | None = None,
) -> Scan:
    """The files `pack_directory(root, ...)` would pack, checked against the limits
    (the same errors), by stat alone. `on_scan(files, bytes)` hears what was found so
    far every `SCAN_REPORT_EVERY` files and once at the end (a large tree takes a
    while to walk: a view can say so before packing starts)."""
    root = Path(root)
    if not root.is_dir():
        raise BundleError(f"cannot pack {str(root)!r}: it is not a directory")
    extras = _checked_extra_files(extra_files or {})
    walked, truncated = _walk(root, walk_cap=max_files * _WALK_CAP_FACTOR, on_scan=on_scan)
    by_name = {entry.name: entry for entry in walked}
    for name, content in extras.items():
        by_name[name] = _Entry(name, None, len(content), executable=False)
    entries = sorted(by_name.values(), key=lambda entry: entry.name)
    _check_limits(entries, max_bytes=max_bytes, max_files=max_files, truncated=truncated)
    _check_no_file_dir_clash(entries)
    return Scan(tuple(entries), extras)


def pack_scan(
    scan: Scan,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> Bundle:
    """Pack what `scan_directory` found; `progress` as `pack_directory`'s."""
    entries = list(scan.entries)
    data, size = _write_tar_gz(entries, scan.extras, max_bytes=max_bytes, progress=progress)
    return Bundle(
        data=data,
        sha256=bundle_bytes_sha256(data),
        size=size,
        num_files=len(entries),
        files=tuple(entry.name for entry in entries),
    )


def pack_directory(
    root: Path,
    *,
    extra_files: Mapping[str, bytes] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
    progress: Callable[[int, int], None] | None = None,
) -> Bundle:
    """Pack the regular files under `root` into a deterministic tar.gz.

    `progress(done, total)` hears the bytes of file content packed so far as they
    are compressed (every few MiB, within a large file too; `total`: all of them),
    for a progress bar.

    Left out: `DEFAULT_IGNORES`, patterns of `.gitignore` files (nested ones
    apply to their subtree) and of `root/.airignore` (which wins over
    `.gitignore`, so `!model.ckpt` there brings a git-ignored file back),
    dangling symlinks, symlinks to directories, fifos, sockets and devices.
    A symlink to a file inside `root` is stored as that file's content.
    `extra_files` adds generated files at the given relative paths, replacing
    any file of the same name.

    Raises:
        BundleTooLargeError: over `max_bytes` of content or `max_files` files;
            the message names the largest directories and files.
        UnsafeBundleError: a symlink points outside `root`, or an extra file's
            path is absolute or uses `..`.
        BundleError: `root` is not a directory, or a file cannot be read or
            has a name a bundle cannot hold.

    Example:
        >>> import tempfile
        >>> bundle = pack_directory(
        ...     Path(tempfile.mkdtemp()), extra_files={"__air_main__.py": b"print('hi')"}
        ... )
        >>> bundle.files
        ('__air_main__.py',)
    """
    scan = scan_directory(root, extra_files=extra_files, max_bytes=max_bytes, max_files=max_files)
    return pack_scan(scan, max_bytes=max_bytes, progress=progress)


# -- walking -------------------------------------------------------------------------------


def _walk(
    root: Path, *, walk_cap: int, on_scan: Callable[[int, int], None] | None = None
) -> tuple[list[_Entry], bool]:
    """Stat (never read) every file to keep; True when the walk stopped at `walk_cap`.
    `on_scan(files, bytes)` hears the count every `SCAN_REPORT_EVERY` files and at the end."""
    found_bytes = 0
    real_root = os.path.realpath(root)
    airignore = _read_patterns(root / ".airignore", ".airignore")
    root_gitignore = (("", _read_patterns(root / ".gitignore", ".gitignore")),)
    entries: list[_Entry] = []
    # (absolute dir, POSIX dir relative to root, .gitignore patterns from root down)
    stack: list[tuple[str, str, tuple[tuple[str, _Patterns], ...]]] = [
        (str(root), "", root_gitignore)
    ]
    while stack:
        dir_path, dir_rel, gitignores = stack.pop()
        for item in _scandir_sorted(dir_path, dir_rel):
            rel = f"{dir_rel}/{item.name}" if dir_rel else item.name
            is_link = item.is_symlink()
            # A link to a directory is matched as a directory ("data/" leaves out a
            # `data -> /mnt/datasets` link) but never followed.
            is_dir = item.is_dir() if is_link else item.is_dir(follow_symlinks=False)
            if _is_ignored(rel, is_dir, airignore, gitignores):
                continue
            if is_link:
                entry = _link_entry(item, rel, real_root)
                if entry is not None:
                    entries.append(_named_ok(entry))
            elif is_dir:
                nested = _read_patterns(Path(item.path, ".gitignore"), f"{rel}/.gitignore")
                stack.append(
                    (item.path, rel, (*gitignores, (rel, nested)) if nested else gitignores)
                )
            elif item.is_file(follow_symlinks=False):
                st = item.stat(follow_symlinks=False)
                entry = _Entry(rel, item.path, st.st_size, _is_exec(st), st.st_mtime_ns)
                entries.append(_named_ok(entry))
                found_bytes += st.st_size
                if on_scan is not None and len(entries) % SCAN_REPORT_EVERY == 0:
                    on_scan(len(entries), found_bytes)
            # Anything else (fifo, socket, device) is not job code: leave it out.
            if len(entries) > walk_cap:
                return entries, True
    if on_scan is not None:
        on_scan(len(entries), found_bytes)
    return entries, False


def _scandir_sorted(dir_path: str, dir_rel: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(dir_path) as items:
            return sorted(items, key=lambda item: item.name)
    except OSError as exc:
        where = dir_rel or "the project root"
        raise BundleError(
            f"cannot list {where!r}: {exc.strerror}: fix its permissions or add it to .airignore"
        ) from exc


def _link_entry(item: os.DirEntry[str], rel: str, real_root: str) -> _Entry | None:
    """A symlink to a file inside the root is stored as that file; dangling links and
    links to directories (not followed) are left out; links leaving the root are refused."""
    target = os.path.realpath(item.path)
    if not os.path.exists(target):
        return None
    if os.path.commonpath([real_root, target]) != real_root:
        raise UnsafeBundleError(
            f"{rel!r} is a symlink to {target!r}, outside the project directory: copy the"
            f" file into the project, or add {rel!r} to .airignore"
        )
    st = os.stat(target)
    if not stat.S_ISREG(st.st_mode):
        return None
    return _Entry(rel, target, st.st_size, _is_exec(st), st.st_mtime_ns)


def _is_exec(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o111)


def _named_ok(entry: _Entry) -> _Entry:
    reason = _unsafe_name_reason(entry.name)
    try:
        entry.name.encode("utf-8")
    except UnicodeEncodeError:
        reason = "the name is not valid UTF-8"
    if reason is not None:
        raise BundleError(
            f"cannot pack {entry.name!r}: {reason}; rename it or add it to .airignore"
        )
    return entry


def _read_patterns(path: Path, label: str) -> _Patterns:
    if not path.is_file():
        return ()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise BundleError(f"cannot read {label}: {exc.strerror}") from exc
    return pathspec.GitIgnoreSpec.from_lines(lines).patterns


def _decide(patterns: _Patterns, path: str) -> bool | None:
    """gitignore semantics: the last matching pattern decides; None when none matches."""
    decision: bool | None = None
    for pattern in patterns:
        if pattern.include is not None and pattern.match_file(path) is not None:
            decision = pattern.include
    return decision


def _is_ignored(
    rel: str,
    is_dir: bool,
    airignore: _Patterns,
    gitignores: tuple[tuple[str, _Patterns], ...],
) -> bool:
    suffix = "/" if is_dir else ""
    if _decide(_DEFAULT_PATTERNS, rel + suffix):
        return True
    decision = _decide(airignore, rel + suffix)
    if decision is not None:
        return decision
    # The deepest .gitignore that has an opinion wins, as in git.
    for base, patterns in reversed(gitignores):
        decision = _decide(patterns, (rel[len(base) + 1 :] if base else rel) + suffix)
        if decision is not None:
            return decision
    return False


# -- checks --------------------------------------------------------------------------------


def _checked_extra_files(extra_files: Mapping[str, bytes]) -> dict[str, bytes]:
    checked: dict[str, bytes] = {}
    for name, content in extra_files.items():
        reason = _unsafe_name_reason(name)
        if reason is not None:
            raise UnsafeBundleError(f"extra file {name!r}: {reason}; give a relative path")
        if not isinstance(content, bytes):
            raise TypeError(f"extra file {name!r}: content must be bytes (use .encode())")
        checked[_canonical(name)] = content
    return checked


def _check_limits(
    entries: list[_Entry], *, max_bytes: int, max_files: int, truncated: bool
) -> None:
    total = sum(entry.size for entry in entries)
    at_least = "at least " if truncated else ""
    more_than = "more than " if truncated else ""
    if total > max_bytes:
        raise BundleTooLargeError(
            f"the bundle is {at_least}{_human_bytes(total)} over"
            f" {more_than}{_plural(len(entries), 'file')}; the limit is {_human_bytes(max_bytes)}: add large data to .airignore and"
            f" read it from shared storage instead (largest: {_largest(entries, by_count=False)})"
        )
    if len(entries) > max_files:
        raise BundleTooLargeError(
            f"the bundle has {more_than}{len(entries):,} files; the limit is {max_files:,}:"
            " add generated or data directories to .airignore"
            f" (most files: {_largest(entries, by_count=True)})"
        )


def _largest(entries: list[_Entry], *, by_count: bool) -> str:
    """The 3 biggest top-level files/dirs, descending while one directory holds all."""
    prefix = ""
    while True:
        groups: dict[str, list[int]] = {}  # name -> [bytes, files]
        for entry in entries:
            if entry.name.startswith(prefix):
                head, slash, _ = entry.name[len(prefix) :].partition("/")
                group = groups.setdefault(prefix + head + slash, [0, 0])
                group[0] += entry.size
                group[1] += 1
        if len(groups) != 1 or not next(iter(groups)).endswith("/"):
            break
        prefix = next(iter(groups))
    index = 1 if by_count else 0
    top = sorted(groups.items(), key=lambda item: (-item[1][index], item[0]))[:3]
    return ", ".join(
        f"{name} {_human_bytes(size)} in {_plural(count, 'file')}"
        if name.endswith("/")
        else f"{name} {_human_bytes(size)}"
        for name, (size, count) in top
    )


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def _check_no_file_dir_clash(entries: list[_Entry]) -> None:
    names = {entry.name for entry in entries}
    for entry in entries:
        parts = entry.name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in names:
                raise BundleError(
                    f"{parent!r} would be both a file and a directory in the bundle"
                    f" (because of {entry.name!r}): rename one of them in extra_files"
                )


# -- writing -------------------------------------------------------------------------------


def _write_tar_gz(
    entries: list[_Entry],
    extras: Mapping[str, bytes],
    *,
    max_bytes: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[bytes, int]:
    buffer = io.BytesIO()
    total = 0
    expected = sum(entry.size for entry in entries)
    # filename="" and mtime=0 keep the gzip header free of anything that varies.
    with (
        gzip.GzipFile(
            filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=_GZIP_LEVEL
        ) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar,
    ):
        for entry in entries:
            if entry.source is None:
                content = extras[entry.name]
            else:
                content = _read_bounded(entry, max_bytes - total)
            total += len(content)
            info = tarfile.TarInfo(entry.name)
            info.size = len(content)
            info.mode = 0o755 if entry.executable else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if progress is None:
                tar.addfile(info, io.BytesIO(content))
                continue
            # heard while the content is compressed: a large file moves the bar too
            tar.addfile(info, _Heard(content, total - len(content), max(expected, total), progress))
            progress(total, max(expected, total))
    return buffer.getvalue(), total


class _Heard(io.BytesIO):
    """File content that tells `progress` how far it was read, every `_HEARD_EVERY` bytes."""

    def __init__(
        self, content: bytes, before: int, total: int, progress: Callable[[int, int], None]
    ) -> None:
        super().__init__(content)
        self._before, self._total, self._progress = before, total, progress
        self._said = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        if self.tell() - self._said >= _HEARD_EVERY:
            self._said = self.tell()
            self._progress(self._before + self._said, self._total)
        return chunk


def _read_bounded(entry: _Entry, remaining: int) -> bytes:
    assert entry.source is not None
    try:
        with open(entry.source, "rb") as f:
            # Files can grow after the walk (a log being written): never read past the limit.
            content = f.read(max(remaining, 0) + 1)
    except OSError as exc:
        raise BundleError(
            f"cannot read {entry.name!r}: {exc.strerror}: fix its permissions or add it to"
            " .airignore"
        ) from exc
    if len(content) > remaining:
        raise BundleTooLargeError(
            f"the bundle grew past the limit while packing (at {entry.name!r}, which is still"
            " being written?): add it to .airignore"
        )
    return content
