"""Unpacked bundles shared by content hash: one copy of the bytes however many jobs run
a bundle, and each job's code directory still takes its relative outputs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from air_sdk.bundle import pack_directory
from air_sdk.bundle.cache import BundleCache
from air_sdk.runner.retention import disk_usage

MIB = 1 << 20


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[str, Path]:
    """A 4 MiB bundle (incompressible data, a script, a link) and its archive."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "weights.bin").write_bytes(os.urandom(4 * MIB))
    (project / "train.py").write_text("print('hi')\n")
    (project / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(project / "run.sh", 0o755)
    packed = pack_directory(project)
    archive = tmp_path / f"{packed.sha256}.tar.gz"
    archive.write_bytes(packed.data)
    return packed.sha256, archive


def test_two_jobs_of_one_bundle_take_its_bytes_once(tmp_path: Path, bundle) -> None:  # type: ignore[no-untyped-def]
    sha, archive = bundle
    cache = BundleCache(tmp_path / "home" / "code-cache")
    jobs = tmp_path / "home" / "jobs"
    a = cache.materialize(sha, archive, jobs / "a" / "code")
    b = cache.materialize(sha, archive, jobs / "b" / "code")
    assert (a / "data" / "weights.bin").read_bytes() == (b / "data" / "weights.bin").read_bytes()
    assert (a / "train.py").stat().st_ino == (b / "train.py").stat().st_ino
    used = disk_usage([tmp_path / "home"])
    assert 4 * MIB <= used < 5 * MIB  # not 8 MiB (per-job copies), not 12 (copies + cache)
    assert os.access(a / "run.sh", os.X_OK)


def test_a_job_writes_relative_outputs_in_its_own_code_dir(tmp_path: Path, bundle) -> None:  # type: ignore[no-untyped-def]
    sha, archive = bundle
    cache = BundleCache(tmp_path / "code-cache")
    a = cache.materialize(sha, archive, tmp_path / "a")
    b = cache.materialize(sha, archive, tmp_path / "b")
    (a / "outputs").mkdir()
    (a / "outputs" / "model.pt").write_bytes(b"weights")
    (a / "data" / "new.txt").write_text("inside a bundled directory too")
    tmp = a / "train.py.new"
    tmp.write_text("print('changed')\n")
    os.replace(tmp, a / "train.py")  # replacing a bundled file is the job's own business
    assert not (b / "outputs").exists() and not (b / "data" / "new.txt").exists()
    assert (b / "train.py").read_text() == "print('hi')\n"
    assert cache.tree(sha).joinpath("train.py").read_text() == "print('hi')\n"


def test_cached_files_are_read_only_and_an_in_place_write_never_reaches_another_job(
    tmp_path: Path, bundle
) -> None:  # type: ignore[no-untyped-def]
    sha, archive = bundle
    cache = BundleCache(tmp_path / "code-cache")
    a = cache.materialize(sha, archive, tmp_path / "a")
    mode = (a / "train.py").stat().st_mode
    assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            (a / "train.py").write_text("print('changed')\n")
        return
    # root ignores permission bits: the write lands in the shared file, and the cache,
    # checking its files before it links them again, unpacks afresh for the next job
    (a / "train.py").write_text("print('changed in place')\n")
    b = cache.materialize(sha, archive, tmp_path / "b")
    assert (b / "train.py").read_text() == "print('hi')\n"
    assert (b / "train.py").stat().st_ino != (a / "train.py").stat().st_ino


def test_an_unused_tree_goes_and_a_used_one_stays(tmp_path: Path, bundle) -> None:  # type: ignore[no-untyped-def]
    from air_sdk.bundle.cache import remove_tree

    sha, archive = bundle
    cache = BundleCache(tmp_path / "code-cache")
    a = cache.materialize(sha, archive, tmp_path / "a")
    assert cache.in_use(sha) and not cache.remove_unused(sha)
    remove_tree(a)
    assert not cache.in_use(sha) and cache.remove_unused(sha)
    assert cache.entries() == [] and not cache.tree(sha).exists()
    again = cache.materialize(sha, archive, tmp_path / "again")  # unpacked anew on demand
    assert (again / "train.py").read_text() == "print('hi')\n"


def test_jobs_of_two_tenants_never_share_a_file(tmp_path: Path, bundle) -> None:  # type: ignore[no-untyped-def]
    """A rank may write its code files in place (it runs as the files' owner): that must
    never reach another tenant's job of the same bundle."""
    sha, archive = bundle
    cache = BundleCache(tmp_path / "code-cache")
    a = cache.for_tenant("team-a").materialize(sha, archive, tmp_path / "a")
    a2 = cache.for_tenant("team-a").materialize(sha, archive, tmp_path / "a2")
    b = cache.for_tenant("team-b").materialize(sha, archive, tmp_path / "b")
    name = next(p.name for p in a.iterdir() if p.is_file())
    assert (a / name).stat().st_ino == (a2 / name).stat().st_ino  # one tenant: shared
    assert (a / name).stat().st_ino != (b / name).stat().st_ino  # two tenants: never
    os.chmod(a / name, 0o644)  # what a job of team-a can do to its own files
    (a / name).write_bytes(b"tampered")
    assert (b / name).read_bytes() != b"tampered"
    assert [c.root for c in cache.with_tenants()] == [
        cache.root,
        cache.root / "tenants" / "team-a",
        cache.root / "tenants" / "team-b",
    ]
