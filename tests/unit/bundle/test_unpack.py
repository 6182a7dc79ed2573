"""unpack_bundle: round trips, and a corpus of hostile archives refused whole."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from air_sdk.bundle import bundle_bytes_sha256, pack_directory, unpack_bundle
from air_sdk.bundle import unpack as unpack_module
from air_sdk.errors import BundleError, BundleTooLargeError, UnsafeBundleError

Member = tuple[tarfile.TarInfo, bytes | None]


def _file(name: str, content: bytes = b"x", mode: int = 0o644) -> Member:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = mode
    return info, content


def _entry(name: str, kind: bytes, linkname: str = "", mode: int = 0o644) -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    return info, None


def _targz(*members: Member, trailing: bytes = b"") -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, content in members:
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return gzip.compress(raw.getvalue() + trailing, compresslevel=1)


def _tree_files(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), os.access(p, os.X_OK))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    """An empty parent for `dest`, so a test can see that nothing at all was left."""
    path = tmp_path / "jobs"
    path.mkdir()
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    files = {
        "train.py": b"print('hi')\n",
        "lib/deep/nested/model.py": b"W = 2\n",
        "data/weights.bin": bytes(range(256)) * 64,
        "run.sh": b"#!/bin/sh\n",
        "caf\u00e9/\u00fcnicode.txt": "\u00e9".encode(),
        "long/" + "n" * 120 + ".py": b"# long name\n",
        "empty.txt": b"",
    }
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    (root / "run.sh").chmod(0o755)
    return root


def test_round_trip_gives_identical_files(project: Path, jobs: Path) -> None:
    bundle = pack_directory(project)

    num_files = unpack_bundle(bundle.data, jobs / "code", expected_sha256=bundle.sha256)

    assert num_files == bundle.num_files == 7
    assert _tree_files(jobs / "code") == _tree_files(project)
    assert _tree_files(jobs / "code")["run.sh"][1] is True
    assert os.listdir(jobs) == ["code"]  # no staging directory left behind


def test_unpacks_from_a_file_path_into_an_empty_directory(project: Path, tmp_path: Path) -> None:
    bundle = pack_directory(project)
    archive = tmp_path / f"{bundle.sha256}.tar.gz"
    archive.write_bytes(bundle.data)
    (tmp_path / "dest").mkdir()

    assert unpack_bundle(archive, tmp_path / "dest", expected_sha256=bundle.sha256) == 7
    assert _tree_files(tmp_path / "dest") == _tree_files(project)


def test_round_trip_without_tarfile_data_filter(
    project: Path, jobs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unpack_module, "_HAS_DATA_FILTER", False)  # Python < 3.11.4
    bundle = pack_directory(project)

    unpack_bundle(bundle.data, jobs / "code")

    assert _tree_files(jobs / "code") == _tree_files(project)


def test_archives_from_plain_tar_with_dot_prefix_unpack(project: Path, jobs: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        tar.add(project, arcname=".")

    assert unpack_bundle(raw.getvalue(), jobs / "code") == 7
    assert _tree_files(jobs / "code") == _tree_files(project)


def test_symlink_inside_the_bundle_is_kept(jobs: Path) -> None:
    data = _targz(_file("lib/a.py", b"A"), _entry("alias.py", tarfile.SYMTYPE, "lib/a.py"))

    assert unpack_bundle(data, jobs / "code") == 2
    assert (jobs / "code" / "alias.py").is_symlink()
    assert (jobs / "code" / "alias.py").read_bytes() == b"A"


def test_sha256_mismatch_is_refused(project: Path, jobs: Path) -> None:
    bundle = pack_directory(project)

    with pytest.raises(BundleError, match="sha256 is .* expected 0{64}: .*upload it again"):
        unpack_bundle(bundle.data, jobs / "code", expected_sha256="0" * 64)
    assert os.listdir(jobs) == []


def test_dest_must_be_new_or_empty(project: Path, jobs: Path) -> None:
    (jobs / "code").mkdir()
    (jobs / "code" / "old.py").write_text("")

    with pytest.raises(BundleError, match="not empty"):
        unpack_bundle(pack_directory(project).data, jobs / "code")
    assert os.listdir(jobs / "code") == ["old.py"]


def test_not_a_gzip_or_truncated_is_a_bundle_error(project: Path, jobs: Path) -> None:
    data = pack_directory(project).data

    with pytest.raises(BundleError, match="not a valid tar.gz"):
        unpack_bundle(b"hello, not a bundle", jobs / "a")
    with pytest.raises(BundleError, match="not a valid tar"):
        unpack_bundle(data[: len(data) // 2], jobs / "b")
    assert os.listdir(jobs) == []


def test_bundle_bytes_sha256_is_the_content_address(project: Path) -> None:
    bundle = pack_directory(project)

    assert bundle_bytes_sha256(bundle.data) == bundle.sha256
    assert bundle_bytes_sha256(b"").startswith("e3b0c44298fc1c14")


def _zeros_bomb() -> bytes:
    return _targz(_file("zeros.bin", bytes(64 << 20)))


def _trailing_zeros_bomb() -> bytes:
    # Tiny declared members; the stream goes on far past them.
    return _targz(_file("a.py", b"pass"), trailing=bytes(64 << 20))


# (builder, limits, exception, words the message must hold)
_HOSTILE: dict[str, tuple[Callable[[], bytes], dict[str, int], type[BundleError], str]] = {
    "absolute path": (
        lambda: _targz(_file("/tmp/evil.py")),
        {},
        UnsafeBundleError,
        "'/tmp/evil.py': absolute paths",
    ),
    "dot-dot traversal": (
        lambda: _targz(_file("ok.py"), _file("../evil.py")),
        {},
        UnsafeBundleError,
        "'../evil.py': '..' components",
    ),
    "dot-dot in the middle": (
        lambda: _targz(_file("a/../../evil.py")),
        {},
        UnsafeBundleError,
        "'..' components",
    ),
    "backslash": (
        lambda: _targz(_file("..\\evil.py")),
        {},
        UnsafeBundleError,
        "backslashes",
    ),
    "symlink to an absolute path": (
        lambda: _targz(_entry("etc", tarfile.SYMTYPE, "/etc")),
        {},
        UnsafeBundleError,
        "'etc': the symlink target '/etc' leaves the bundle",
    ),
    "symlink up and out": (
        lambda: _targz(_entry("up", tarfile.SYMTYPE, "../../outside")),
        {},
        UnsafeBundleError,
        "leaves the bundle",
    ),
    "symlink escaping through another symlink": (
        lambda: _targz(
            _entry("here", tarfile.SYMTYPE, "."), _entry("parent", tarfile.SYMTYPE, "here/..")
        ),
        {},
        UnsafeBundleError,
        "'parent': the symlink target 'here/..' leaves the bundle",
    ),
    "symlink then a file through it": (
        lambda: _targz(_entry("out", tarfile.SYMTYPE, "sub"), _file("out/evil.py")),
        {},
        UnsafeBundleError,
        "'out/evil.py': it would be written through a symlink",
    ),
    "symlink out then a file through it": (
        lambda: _targz(_entry("out", tarfile.SYMTYPE, "/tmp"), _file("out/evil.py")),
        {},
        UnsafeBundleError,
        "symlink",
    ),
    "hard link": (
        lambda: _targz(_file("a.py"), _entry("b.py", tarfile.LNKTYPE, "a.py")),
        {},
        UnsafeBundleError,
        "'b.py': hard links",
    ),
    "char device": (
        lambda: _targz(_entry("null", tarfile.CHRTYPE)),
        {},
        UnsafeBundleError,
        "'null': device files",
    ),
    "block device": (
        lambda: _targz(_entry("sda", tarfile.BLKTYPE)),
        {},
        UnsafeBundleError,
        "device files",
    ),
    "fifo": (
        lambda: _targz(_entry("pipe", tarfile.FIFOTYPE)),
        {},
        UnsafeBundleError,
        "'pipe': fifos",
    ),
    "setuid file": (
        lambda: _targz(_file("su", b"#!/bin/sh\n", mode=0o4755)),
        {},
        UnsafeBundleError,
        "'su': setuid/setgid/sticky bits are not allowed (mode 4755)",
    ),
    "setgid file": (
        lambda: _targz(_file("sg", mode=0o2755)),
        {},
        UnsafeBundleError,
        "setuid/setgid/sticky",
    ),
    "sticky directory": (
        lambda: _targz(_entry("tmp", tarfile.DIRTYPE, mode=0o1777)),
        {},
        UnsafeBundleError,
        "setuid/setgid/sticky",
    ),
    "same path twice": (
        lambda: _targz(_file("a.py", b"1"), _file("./a.py", b"2")),
        {},
        UnsafeBundleError,
        "appears twice",
    ),
    "member decompressing past the limit": (
        _zeros_bomb,
        {"max_bytes": 1 << 20},
        BundleTooLargeError,
        "the limit is 1 MiB",
    ),
    "declared sizes over the limit": (
        lambda: _targz(_file("a.bin", bytes(600 << 10)), _file("b.bin", bytes(600 << 10))),
        {"max_bytes": 1 << 20},
        BundleTooLargeError,
        "declares more than 1 MiB of files (at 'b.bin')",
    ),
    "stream far longer than its members": (
        _trailing_zeros_bomb,
        {"max_bytes": 1 << 20, "max_files": 10},
        BundleTooLargeError,
        "decompresses to more than",
    ),
    "too many members": (
        lambda: _targz(*(_file(f"f{i}.py") for i in range(30))),
        {"max_files": 10},
        BundleTooLargeError,
        "more than 10 entries; the limit is 10",
    ),
}


@pytest.mark.parametrize("case", list(_HOSTILE), ids=list(_HOSTILE))
def test_hostile_archive_is_refused_and_nothing_is_written(
    case: str, tmp_path: Path, jobs: Path
) -> None:
    build, limits, error, words = _HOSTILE[case]
    dest = jobs / "code"

    with pytest.raises(error) as info:
        unpack_bundle(build(), dest, **limits)

    assert words in str(info.value)
    assert not dest.exists()
    assert os.listdir(jobs) == []
    assert sorted(os.listdir(tmp_path)) == ["jobs"]  # nothing escaped next to it either


@pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="needs tarfile's data filter")
def test_data_filter_is_a_second_line_of_defence(
    jobs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unpack_module, "_link_stays_inside", lambda *_: True)  # a bug upstream
    data = _targz(_file("a.py"), _entry("etc", tarfile.SYMTYPE, "/etc"))

    with pytest.raises(UnsafeBundleError, match="'etc'"):
        unpack_bundle(data, jobs / "code")
    assert os.listdir(jobs) == []
