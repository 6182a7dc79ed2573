"""Reading and writing inside directories a job can write, without following a link the
job could have planted there.

A check by name and a later `open()` by name is a race a job wins: between the two it
swaps a file for a symlink to the gateway's own files (issue 19: the outputs route
served another tenant's secrets after about 20 tries). So nothing here names a path
twice. A directory the gateway chose (`base`) is opened once; every component below
it is opened relative to its parent's fd with `O_NOFOLLOW` (directories with
`O_DIRECTORY` too), a file is checked with `fstat` on the fd it will be read from, and
a file is written as a fresh temporary name (`O_CREAT|O_EXCL|O_NOFOLLOW`) renamed
over the old one, which replaces a planted link instead of writing through it.

Example:
    >>> import tempfile
    >>> base = Path(tempfile.mkdtemp())
    >>> fd = open_dir(base, "a/b", create=True)
    >>> replace_file(fd, "x.txt", b"hi")
    >>> with os.fdopen(open_file(fd, "x.txt"), "rb") as f:
    ...     f.read()
    b'hi'
    >>> os.symlink("/etc/passwd", base / "a" / "b" / "link")
    >>> open_file(fd, "link")
    Traceback (most recent call last):
    ...
    air_sdk.errors.UnsafePathError: 'link' is a symlink; only the directory's own files are read
    >>> os.close(fd)
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from air_sdk.errors import UnsafePathError

__all__ = ["iter_files", "open_append", "open_dir", "open_file", "parts_of", "replace_file"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO the job made must not hang a gateway thread
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def parts_of(relative: str | PurePosixPath) -> tuple[str, ...]:
    """The components of a '/'-separated relative path; an `UnsafePathError` for one
    that is empty, absolute, climbs with `..` or holds a NUL or a backslash.

    Example:
        >>> parts_of("model/weights.bin")
        ('model', 'weights.bin')
        >>> parts_of("../x")
        Traceback (most recent call last):
        ...
        air_sdk.errors.UnsafePathError: '../x' is not a path inside the directory
    """
    text = str(relative)
    parts = PurePosixPath(text).parts
    if (
        not text
        or "\x00" in text
        or "\\" in text
        or text.startswith("/")
        or any(p in ("..", ".") for p in parts)
    ):
        raise UnsafePathError(f"{text!r} is not a path inside the directory")
    return parts


def _refusal(
    dir_fd: int, name: str, shown: str, exc: OSError, what: str
) -> UnsafePathError | FileNotFoundError:
    """Why opening `name` under `dir_fd` failed: an `UnsafePathError` in words (the
    lstat only names it), or FileNotFoundError when nothing is there."""
    try:
        if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
            return UnsafePathError(
                f"{shown!r} is a symlink; only the directory's own files are read"
            )
    except OSError:
        pass
    if exc.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, "no such file or directory", shown)
    return UnsafePathError(f"{shown!r} is not {what}")


def _open_below(dir_fd: int, parts: tuple[str, ...], shown: str, *, create: bool) -> int:
    """The fd of the directory `parts` name under `dir_fd` (not closed), each opened
    with O_NOFOLLOW; with `create`, missing ones are made (mode 0o755)."""
    fd = os.dup(dir_fd)
    try:
        for part in parts:
            try:
                if create:
                    _make_dir(fd, part)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _refusal(fd, part, shown, exc, "a directory") from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _make_dir(dir_fd: int, name: str) -> None:
    """`name` made a directory in `dir_fd`: a link in its place (planted) is removed
    first, never followed."""
    if _is_link(dir_fd, name):
        os.unlink(name, dir_fd=dir_fd)
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError:
        pass


def open_dir(base: Path, relative: str | PurePosixPath = "", *, create: bool = False) -> int:
    """The fd (O_DIRECTORY) of `base / relative`: `base` is the gateway's own and opened
    as named; every component of `relative` is opened with O_NOFOLLOW below it, so a
    directory a job swapped for a link is refused (`UnsafePathError`); a missing one
    raises FileNotFoundError. With `create`, missing directories are made and a link
    in the place of one is removed and made a directory. The caller closes the fd.

    Example:
        >>> os.close(open_dir(Path("/"), "tmp"))
    """
    parts = parts_of(relative) if str(relative) not in ("", ".") else ()
    if create:
        base.mkdir(parents=True, exist_ok=True)
    top = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_below(top, parts, str(relative), create=create)
    finally:
        os.close(top)


def open_file(dir_fd: int, relative: str | PurePosixPath) -> int:
    """A read-only fd of the regular file `relative` under `dir_fd`, every component
    opened with O_NOFOLLOW and the file checked with `fstat` on that very fd: an
    `UnsafePathError` for a link, a directory, a FIFO or a device (FileNotFoundError
    when nothing is there). Read from this fd; never open the name again.

    Example:
        >>> root = os.open("/", os.O_RDONLY)
        >>> open_file(root, "tmp")
        Traceback (most recent call last):
        ...
        air_sdk.errors.UnsafePathError: 'tmp' is not a regular file
        >>> os.close(root)
    """
    parts = parts_of(relative)
    shown = str(relative)
    parent = _open_below(dir_fd, parts[:-1], shown, create=False)
    try:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise _refusal(parent, parts[-1], shown, exc, "a regular file") from None
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{shown!r} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def iter_files(dir_fd: int) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file under `dir_fd`, directories sorted,
    links neither listed nor entered (`os.fwalk` checks each directory it opens is the
    one it listed, so a swap while walking is skipped, not followed).

    Example: see `replace_file`.
    """
    for dirpath, dirnames, filenames, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        dirnames.sort()
        for name in filenames:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # removed while we walked
            if stat.S_ISREG(st.st_mode):
                yield PurePosixPath(dirpath, name).as_posix().removeprefix("./"), st


def replace_file(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Write `data` as the file `name` in `dir_fd`: into a new temporary name created
    with O_EXCL|O_NOFOLLOW, then renamed over `name`, so a link planted at `name` is
    replaced, never written through.

    Example:
        >>> import tempfile
        >>> d = os.open(tempfile.mkdtemp(), os.O_RDONLY)
        >>> replace_file(d, "a.py", b"pass")
        >>> [path for path, _ in iter_files(d)]
        ['a.py']
        >>> os.close(d)
    """
    (leaf,) = parts_of(name)
    tmp = f".{leaf}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def open_append(base: Path, relative: str | PurePosixPath, mode: int = 0o600) -> int:
    """A write-only O_APPEND fd of the file `base / relative`, made with its directories
    when missing, for a log the gateway writes into a directory a job can write: every
    component below `base` opened with O_NOFOLLOW, and a link planted in the place of
    a directory or of the file removed and made anew, never written through.

    Example:
        >>> import tempfile
        >>> base = Path(tempfile.mkdtemp())
        >>> os.makedirs(base / "a"); os.symlink("/etc/passwd", base / "a" / "x.log")
        >>> fd = open_append(base, "a/x.log"); _ = os.write(fd, b"hi"); os.close(fd)
        >>> (base / "a" / "x.log").is_symlink(), (base / "a" / "x.log").read_text()
        (False, 'hi')
    """
    parts = parts_of(relative)
    parent = open_dir(base, PurePosixPath(*parts[:-1]) if parts[1:] else "", create=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(parts[-1], flags | os.O_NONBLOCK, mode, dir_fd=parent)
        except OSError:
            if not _is_link(parent, parts[-1]):
                raise
            os.unlink(parts[-1], dir_fd=parent)
            fd = os.open(parts[-1], flags | os.O_EXCL, mode, dir_fd=parent)
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{str(relative)!r} is not a regular file")
    os.set_blocking(fd, True)
    return fd
