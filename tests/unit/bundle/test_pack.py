"""pack_directory: what lands in a bundle, determinism, ignore files and limits."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

import air_sdk.bundle as bundle_pkg
from air_sdk.bundle import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, Bundle, pack_directory
from air_sdk.errors import BundleError, BundleTooLargeError, UnsafeBundleError


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        path.write_bytes(content)
    return root


def _members(bundle: Bundle) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def _project(root: Path) -> Path:
    return _tree(root, {"train.py": "print('train')\n", "lib/model.py": "X = 1\n", "README": "hi"})


def test_all_is_sorted_and_complete() -> None:
    # isort order, as ruff's RUF022 and air_sdk.schema: CONSTANTS, Classes, functions.
    def isort_key(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert bundle_pkg.__all__ == sorted(bundle_pkg.__all__, key=isort_key)
    public = {n for n in vars(bundle_pkg) if not n.startswith("_")} - {
        "annotations",
        "cache",
        "files",
        "pack",
        "unpack",
    }
    assert set(bundle_pkg.__all__) == public
    assert DEFAULT_MAX_BYTES == 512 * 1024 * 1024
    assert DEFAULT_MAX_FILES == 20_000


def test_bundle_lists_files_sorted_with_sizes(tmp_path: Path) -> None:
    bundle = pack_directory(_project(tmp_path / "p"))

    assert bundle.files == ("README", "lib/model.py", "train.py")
    assert bundle.num_files == 3
    assert bundle.size == len("print('train')\n") + len("X = 1\n") + 2
    assert len(bundle.sha256) == 64
    assert "data" not in repr(bundle)  # the bytes never flood a log line


def test_same_tree_gives_same_sha256(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    first = pack_directory(root)

    assert pack_directory(root).sha256 == first.sha256
    assert pack_directory(root).data == first.data


def test_sha256_ignores_mtime_noop_chmod_and_location(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    before = pack_directory(root).sha256

    for path in root.rglob("*"):
        os.utime(path, (1_000_000_000, 1_000_000_000))  # `touch` to another time
        os.chmod(path, path.stat().st_mode)
    (root / "README").chmod(0o600)  # still not executable: stored as 0o644
    copy = shutil.copytree(root, tmp_path / "elsewhere" / "deeper" / "copy")

    assert pack_directory(root).sha256 == before
    assert pack_directory(copy).sha256 == before


def test_sha256_changes_with_content_name_or_exec_bit(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    before = pack_directory(root).sha256

    (root / "train.py").write_text("print('train!')\n")
    after_edit = pack_directory(root).sha256
    (root / "train.py").chmod(0o755)
    after_chmod = pack_directory(root).sha256

    assert len({before, after_edit, after_chmod}) == 3


def test_members_are_normalized(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    (root / "train.py").chmod(0o600)

    bundle = pack_directory(root)
    members = _members(bundle)

    assert list(members) == sorted(members)
    assert all(m.isreg() for m in members.values())  # no directory entries
    assert {m.mtime for m in members.values()} == {0}
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(0, 0, "", "")}
    assert members["run.sh"].mode == 0o755
    assert members["train.py"].mode == 0o644
    # gzip header: no FNAME flag, mtime 0.
    assert bundle.data[3] & 0x08 == 0
    assert bundle.data[4:8] == b"\0\0\0\0"
    assert gzip.decompress(bundle.data)  # a plain, valid gzip stream


def test_default_ignores(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "p",
        {
            "train.py": "",
            ".git/config": "",
            ".hg/store": "",
            ".venv/lib/site.py": "",
            "venv/bin/python": "",
            "__pycache__/train.cpython-311.pyc": "",
            "lib/__pycache__/m.cpython-311.pyc": "",
            "lib/m.py": "",
            "lib/old.pyc": "",
            ".ipynb_checkpoints/nb-checkpoint.ipynb": "",
            ".air/cache": "",
            "sub/.git": "gitdir: ../.git/modules/sub",
            "venv.py": "",  # a file that merely looks like a default name is kept
        },
    )

    assert pack_directory(root).files == ("lib/m.py", "train.py", "venv.py")


def test_gitignore_patterns_are_respected(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "p",
        {
            ".gitignore": "# outputs\n*.log\n!keep.log\nbuild/\n/top.txt\n",
            "train.py": "",
            "run.log": "",
            "keep.log": "",
            "build/out.bin": "",
            "src/build/gen.py": "",
            "top.txt": "",
            "src/top.txt": "",
            "src/debug.log": "",
        },
    )

    assert pack_directory(root).files == (
        ".gitignore",
        "keep.log",
        "src/top.txt",
        "train.py",
    )


def test_nested_gitignore_applies_to_its_subtree_only(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "p",
        {
            ".gitignore": "*.tmp\n",
            "secret.txt": "",
            "a.tmp": "",
            "sub/.gitignore": "secret.txt\n!important.tmp\n/local/\n",
            "sub/secret.txt": "",
            "sub/deeper/secret.txt": "",
            "sub/important.tmp": "",
            "sub/other.tmp": "",
            "sub/local/x.py": "",
            "sub/deeper/local/y.py": "",
            "other/secret.txt": "",
        },
    )

    assert pack_directory(root).files == (
        ".gitignore",
        "other/secret.txt",
        "secret.txt",
        "sub/.gitignore",
        "sub/deeper/local/y.py",
        "sub/important.tmp",
    )


def test_airignore_excludes_and_wins_over_gitignore(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "p",
        {
            ".gitignore": "*.ckpt\n",
            ".airignore": "data/\nwandb/\n!model.ckpt\n",
            "train.py": "",
            "data/train.bin": "x" * 100,
            "wandb/run/log.txt": "",
            "model.ckpt": "",
            "old.ckpt": "",
        },
    )

    assert pack_directory(root).files == (".airignore", ".gitignore", "model.ckpt", "train.py")


def test_extra_files_are_added_and_override(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p", {"train.py": "old", ".airignore": "gen/\n"})

    bundle = pack_directory(
        root,
        extra_files={
            "__air_main__.py": b"print('cell')\n",
            "train.py": b"new",
            "gen/cfg.json": b"{}",
        },
    )

    assert bundle.files == (".airignore", "__air_main__.py", "gen/cfg.json", "train.py")
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        assert tar.extractfile("train.py").read() == b"new"  # type: ignore[union-attr]
        assert tar.extractfile("__air_main__.py").read() == b"print('cell')\n"  # type: ignore[union-attr]


def test_extra_files_work_without_any_directory_content(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()

    bundle = pack_directory(tmp_path / "empty", extra_files={"__air_main__.py": b"pass\n"})

    assert bundle.files == ("__air_main__.py",)


@pytest.mark.parametrize("name", ["../escape.py", "/etc/cron.d/x", "a/../../b", "a\\b.py"])
def test_unsafe_extra_file_paths_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeBundleError, match="relative path"):
        pack_directory(_project(tmp_path / "p"), extra_files={name: b""})


def test_extra_file_that_clashes_with_a_file_is_refused(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")

    with pytest.raises(BundleError, match="'train.py' would be both a file and a directory"):
        pack_directory(root, extra_files={"train.py/x.py": b""})


def test_symlink_to_file_inside_is_stored_as_its_content(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    (root / "alias.py").symlink_to("lib/model.py")
    (root / "lib_link").symlink_to("lib", target_is_directory=True)  # not followed
    (root / "dangling.py").symlink_to("missing.py")

    bundle = pack_directory(root)

    assert bundle.files == ("README", "alias.py", "lib/model.py", "train.py")
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        member = tar.getmember("alias.py")
        assert member.isreg()
        assert tar.extractfile(member).read() == b"X = 1\n"  # type: ignore[union-attr]


def test_symlink_leaving_the_root_is_refused_with_advice(tmp_path: Path) -> None:
    outside = _tree(tmp_path / "outside", {"secrets.env": "TOKEN=1"})
    root = _project(tmp_path / "p")
    (root / "lib" / "env").symlink_to(outside / "secrets.env")

    with pytest.raises(UnsafeBundleError) as info:
        pack_directory(root)

    message = str(info.value)
    assert "'lib/env'" in message
    assert "outside the project" in message
    assert ".airignore" in message


def test_symlink_leaving_the_root_is_fine_once_ignored(tmp_path: Path) -> None:
    datasets = _tree(tmp_path / "mnt", {"imagenet/x.bin": "x"})
    root = _project(tmp_path / "p")
    (root / "data").symlink_to(datasets, target_is_directory=True)
    (root / ".airignore").write_text("data/\n")

    assert "data" not in " ".join(pack_directory(root).files)


def test_over_the_size_limit_names_the_largest(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "p",
        {
            "data/a.bin": b"\0" * 40_000,
            "data/b.bin": b"\0" * 40_000,
            "data/c.bin": b"\0" * 40_000,
            "model.bin": b"\0" * 30_000,
            "src/train.py": b"pass\n",
        },
    )

    with pytest.raises(BundleTooLargeError) as info:
        pack_directory(root, max_bytes=64 * 1024)

    message = str(info.value)
    assert "the bundle is 146.5 KiB over 5 files; the limit is 64 KiB" in message
    assert "add large data to .airignore" in message
    assert (
        "largest: data/ 117.2 KiB in 3 files, model.bin 29.3 KiB, src/ 5 bytes in 1 file)"
        in message
    )


def test_size_limit_is_checked_before_reading_any_file(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    with open(root / "dataset.bin", "wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB to read, nothing on disk

    with pytest.raises(BundleTooLargeError, match="the bundle is 8.0 GiB over 4 files"):
        pack_directory(root)


def test_over_the_file_limit_names_the_fullest_directory(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "p",
        {**{f"node_modules/pkg{i}/index.js": "" for i in range(12)}, "train.py": ""},
    )

    with pytest.raises(BundleTooLargeError) as info:
        pack_directory(root, max_files=10)

    message = str(info.value)
    assert "the bundle has 13 files; the limit is 10" in message
    assert "most files: node_modules/" in message
    assert "12 files" in message


def test_runaway_tree_stops_the_walk_early(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p", {f"logs/{i:03}.txt": "" for i in range(100)})

    with pytest.raises(BundleTooLargeError, match="the bundle has more than 21 files"):
        pack_directory(root, max_files=2)


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")

    with pytest.raises(BundleError, match="not a directory"):
        pack_directory(tmp_path / "train.py")
    with pytest.raises(BundleError, match="not a directory"):
        pack_directory(tmp_path / "missing")


def test_fifo_is_left_out(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    os.mkfifo(root / "pipe")  # reading it would block forever

    assert "pipe" not in pack_directory(root).files


def test_progress_hears_the_bytes_packed_up_to_the_total(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"f{i}.bin").write_bytes(b"x" * 1000 * (i + 1))
    heard: list[tuple[int, int]] = []
    pack_directory(tmp_path, progress=lambda done, total: heard.append((done, total)))
    assert heard == [(1000, 6000), (3000, 6000), (6000, 6000)]


def test_progress_moves_within_one_large_file(tmp_path: Path) -> None:
    # a bar that jumped from 0 to the whole size and then sat was what users saw
    (tmp_path / "weights.bin").write_bytes(os.urandom(12 << 20))
    heard: list[tuple[int, int]] = []
    pack_directory(tmp_path, progress=lambda done, total: heard.append((done, total)))
    total = 12 << 20
    assert heard[-1] == (total, total)
    assert [done for done, _ in heard if 0 < done < total]  # heard while compressing
