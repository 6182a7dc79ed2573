"""Safe unpacking of a job bundle (a tar.gz of job code) into a fresh directory.

Every member is checked before anything is written: an archive that would
escape `dest`, carries links, devices or setuid bits, or decompresses past the
limits is refused whole. Extraction then goes through `tarfile`'s "data"
filter as a second line of defence, into a temporary directory that is renamed
onto `dest` only when everything succeeded.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import hashlib
import io
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from air_sdk.errors import BundleError, BundleTooLargeError, UnsafeBundleError

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_FILES", "bundle_bytes_sha256", "unpack_bundle"]

#: Uncompressed bytes of file content one bundle may hold.
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
#: Files one bundle may hold.
DEFAULT_MAX_FILES = 20_000

_CHUNK = 1 << 20
# Tar framing on top of file content: a 512-byte header plus padding per member,
# sometimes a PAX header for long or non-ASCII names. Generous, but bounded.
_OVERHEAD_PER_MEMBER = 2048
_OVERHEAD_SLACK = 1 << 20
_MAX_LINK_HOPS = 40
_EMPTY_PATH = "the path is empty"
_DRIVE = re.compile(r"^[A-Za-z]:(/|$)")  # "C:/x" would be absolute if unpacked on Windows
_HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
_FILTER_ERRORS: tuple[type[Exception], ...] = (
    (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()
)


def bundle_bytes_sha256(data: bytes) -> str:
    """The content address of a bundle: the hex sha256 of its compressed bytes.

    Example:
        >>> bundle_bytes_sha256(b"")[:16]
        'e3b0c44298fc1c14'
    """
    return hashlib.sha256(data).hexdigest()


def unpack_bundle(
    data: bytes | Path,
    dest: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
    expected_sha256: str | None = None,
) -> int:
    """Unpack a bundle (bytes, or a path to a .tar.gz) into `dest`; return its file count.

    `dest` must be missing or an empty directory. Nothing appears at `dest`
    unless the whole bundle passed every check and was extracted.

    Raises:
        BundleError: sha256 mismatch, not a tar.gz, or `dest` is not empty.
        BundleTooLargeError: over `max_bytes` (declared or actually decompressed)
            or `max_files`.
        UnsafeBundleError: absolute or `..` paths, backslashes, links leaving
            `dest`, hard links, devices, fifos, setuid/setgid/sticky bits.

    Example:
        >>> import tempfile
        >>> from air_sdk.bundle import pack_directory
        >>> bundle = pack_directory(Path(tempfile.mkdtemp()), extra_files={"t.py": b"x = 1"})
        >>> unpack_bundle(bundle.data, Path(tempfile.mkdtemp()) / "code",
        ...               expected_sha256=bundle.sha256)
        1
    """
    dest = Path(dest)
    _check_dest(dest)
    with _open_source(data) as raw:
        if expected_sha256 is not None:
            _verify_sha256(raw, expected_sha256)
            raw.seek(0)
        with tempfile.TemporaryFile() as tar_file:
            _gunzip_bounded(raw, tar_file, max_bytes=max_bytes, max_files=max_files)
            tar_file.seek(0)
            try:
                with tarfile.open(fileobj=tar_file, mode="r:") as tar:
                    members = _scan_members(tar, max_bytes=max_bytes, max_files=max_files)
                    return _extract_into(tar, members, dest, max_bytes=max_bytes)
            except (tarfile.TarError, EOFError) as exc:
                raise BundleError(f"the bundle is not a valid tar archive: {exc}") from exc


# -- input ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_source(data: bytes | Path) -> Iterator[IO[bytes]]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield io.BytesIO(bytes(data))
        return
    try:
        f = open(data, "rb")  # noqa: SIM115 - closed below, after the caller is done
    except OSError as exc:
        raise BundleError(f"cannot read bundle file {str(data)!r}: {exc.strerror}") from exc
    with f:
        yield f


def _verify_sha256(raw: IO[bytes], expected: str) -> None:
    digest = hashlib.sha256()
    while chunk := raw.read(_CHUNK):
        digest.update(chunk)
    actual = digest.hexdigest()
    if actual != expected.strip().lower():
        raise BundleError(
            f"the bundle's sha256 is {actual}, expected {expected}: it was corrupted or"
            " changed in transit; upload it again"
        )


def _gunzip_bounded(raw: IO[bytes], out: IO[bytes], *, max_bytes: int, max_files: int) -> None:
    """Decompress into `out`, counting real bytes: a bomb stops at the limit, whatever
    its headers declare."""
    limit = max_bytes + _OVERHEAD_PER_MEMBER * (max_files + 2) + _OVERHEAD_SLACK
    written = 0
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
            while chunk := gz.read(_CHUNK):
                written += len(chunk)
                if written > limit:
                    raise BundleTooLargeError(
                        f"the bundle decompresses to more than {_human_bytes(limit)}; the limit"
                        f" is {_human_bytes(max_bytes)} of files: it is corrupt or an archive"
                        " bomb; pack it again with air_sdk.bundle.pack_directory"
                    )
                out.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        # gzip.BadGzipFile is an OSError.
        raise BundleError(f"the bundle is not a valid tar.gz: {exc}") from exc


# -- checks --------------------------------------------------------------------------------


def _check_dest(dest: Path) -> None:
    if dest.is_symlink():
        raise BundleError(f"cannot unpack into {str(dest)!r}: it is a symlink; give a real path")
    if dest.exists():
        if not dest.is_dir():
            raise BundleError(f"cannot unpack into {str(dest)!r}: it is a file, not a directory")
        if any(dest.iterdir()):
            raise BundleError(
                f"cannot unpack into {str(dest)!r}: it is not empty; give a new or empty directory"
            )


def _unsafe_name_reason(name: str) -> str | None:
    """Why `name` may not be a path inside a bundle, or None when it may."""
    if "\x00" in name:
        return "NUL bytes are not allowed in paths"
    if "\\" in name:
        return "backslashes are not allowed in paths (use '/')"
    if name.startswith("/") or _DRIVE.match(name):
        return "absolute paths are not allowed"
    if ".." in name.split("/"):
        return "'..' components are not allowed"
    if not _canonical(name):
        return _EMPTY_PATH
    return None


def _canonical(name: str) -> str:
    return "/".join(part for part in name.split("/") if part not in ("", "."))


def _unsafe(member: tarfile.TarInfo, rule: str) -> UnsafeBundleError:
    return UnsafeBundleError(f"unsafe bundle member {member.name!r}: {rule}; nothing was unpacked")


def _scan_members(tar: tarfile.TarFile, *, max_bytes: int, max_files: int) -> list[tarfile.TarInfo]:
    """Read every header and check it, stopping at the first limit crossed (before
    tarfile seeks over a member's declared size)."""
    members: list[tarfile.TarInfo] = []
    seen: set[str] = set()
    links: dict[str, str] = {}
    declared = 0
    while (member := tar.next()) is not None:
        if len(members) >= max_files:
            raise BundleTooLargeError(
                f"the bundle holds more than {max_files:,} entries; the limit is {max_files:,}:"
                " add generated or data directories to .airignore"
            )
        declared += max(member.size, 0)
        if declared > max_bytes:
            raise BundleTooLargeError(
                f"the bundle declares more than {_human_bytes(max_bytes)} of files (at"
                f" {member.name!r}); the limit is {_human_bytes(max_bytes)}: add large data to"
                " .airignore and read it from shared storage instead"
            )
        reason = _unsafe_name_reason(member.name)
        if reason == _EMPTY_PATH and member.isdir():
            continue  # "./", the archive's own root, as plain `tar -C dir .` writes it
        if reason is not None:
            raise _unsafe(member, reason)
        _check_type_and_mode(member)
        name = _canonical(member.name)
        if name in seen:
            raise _unsafe(member, "the path appears twice in the archive")
        seen.add(name)
        if member.issym():
            links[name] = member.linkname
        members.append(member)
    for member in members:
        name = _canonical(member.name)
        parts = name.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in links:
                raise _unsafe(member, "it would be written through a symlink in the archive")
        if member.issym() and not _link_stays_inside(name, links):
            raise _unsafe(
                member, f"the symlink target {member.linkname!r} leaves the bundle (or loops)"
            )
    return members


def _check_type_and_mode(member: tarfile.TarInfo) -> None:
    if member.islnk():
        raise _unsafe(member, "hard links are not allowed")
    if member.ischr() or member.isblk():
        raise _unsafe(member, "device files are not allowed")
    if member.isfifo():
        raise _unsafe(member, "fifos are not allowed")
    if not (member.isreg() or member.isdir() or member.issym()):
        raise _unsafe(member, f"entry type {member.type!r} is not a file, directory or symlink")
    if member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        raise _unsafe(member, f"setuid/setgid/sticky bits are not allowed (mode {member.mode:o})")
    if member.issym() and (not member.linkname or "\x00" in member.linkname):
        raise _unsafe(member, "the symlink target is empty or holds a NUL byte")


def _link_stays_inside(link: str, links: dict[str, str]) -> bool:
    """Resolve `link` the way the kernel would once everything is extracted, following
    symlinks among the archive's own members, and say whether it stays inside.

    A lexical check is not enough: with `d -> .`, the target `d/..` leaves the root.
    """
    resolved: list[str] = link.split("/")[:-1]
    pending = links[link].split("/")
    if links[link].startswith("/"):
        return False
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                return False
            resolved.pop()
            continue
        resolved.append(part)
        target = links.get("/".join(resolved))
        if target is not None:
            hops += 1
            if hops > _MAX_LINK_HOPS or target.startswith("/"):
                return False
            resolved.pop()
            pending = target.split("/") + pending
    return True


# -- extraction ----------------------------------------------------------------------------


def _extract_into(
    tar: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path, *, max_bytes: int
) -> int:
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.unpack-", dir=dest.parent))
    os.chmod(staging, 0o755)  # mkdtemp's 0o700 would lock out workers running as another user
    try:
        num_files = 0
        written = 0
        for member in members:
            name = _canonical(member.name)
            _extract_one(tar, member, staging)
            if member.isdir():
                continue
            num_files += 1
            if member.isreg():
                written += (staging / name).lstat().st_size
                if written > max_bytes:
                    raise BundleTooLargeError(
                        f"the bundle unpacks to more than {_human_bytes(max_bytes)}; the limit"
                        f" is {_human_bytes(max_bytes)}: add large data to .airignore and read"
                        " it from shared storage instead"
                    )
        try:
            # Replaces `dest` only if it is missing or still empty.
            os.rename(staging, dest)
        except OSError as exc:
            raise BundleError(
                f"cannot move the unpacked bundle to {str(dest)!r}: {exc.strerror}"
            ) from exc
        return num_files
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, staging: Path) -> None:
    try:
        if _HAS_DATA_FILTER:
            tar.extract(member, staging, filter="data")
        else:
            tar.extract(_data_filter_fallback(member), staging, numeric_owner=True)
    except _FILTER_ERRORS as exc:
        raise UnsafeBundleError(
            f"unsafe bundle member {member.name!r}: {exc}; nothing was unpacked"
        ) from exc
    except OSError as exc:
        raise BundleError(f"cannot write bundle member {member.name!r}: {exc}") from exc


def _data_filter_fallback(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """What `tarfile.data_filter` does, for Pythons that lack it (before 3.10.12/3.11.4).
    Paths, links and types were already checked; this makes ownership and modes safe."""
    safe = copy.copy(member)
    safe.uid, safe.gid = os.getuid(), os.getgid()
    safe.uname = safe.gname = ""
    if member.isdir():
        safe.mode = 0o755
    elif member.isreg():
        safe.mode = (member.mode & 0o755) | 0o600
    return safe


def _human_bytes(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "bytes":
        return f"{num_bytes:,} bytes"
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
