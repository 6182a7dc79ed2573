"""Retention of ended jobs' files: the oldest go, active jobs are never touched, the
bytes reported are the bytes that leave the disk, and records stay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from air_sdk.bundle import pack_directory
from air_sdk.bundle.cache import BundleCache
from air_sdk.runner.retention import RetentionPolicy, collect_garbage, disk_usage
from air_sdk.schema import JobSpec, JobState
from air_sdk.store import SqliteStore

MIB = 1 << 20
DAY = 86400.0


class Home:
    """A gateway home: the store, the code cache, and jobs with files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = SqliteStore(root / "air.db")
        self.cache = BundleCache(root / "code-cache")
        self.jobs = root / "jobs"
        project = root / "project"
        project.mkdir()
        (project / "weights.bin").write_bytes(os.urandom(2 * MIB))
        packed = pack_directory(project)
        self.sha = packed.sha256
        self.archive = root / "bundle.tar.gz"
        self.archive.write_bytes(packed.data)

    def job(self, end: JobState | None, output_mib: int = 1) -> str:
        """A job whose code links the bundle and that wrote `output_mib` of its own."""
        record, _ = self.store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
        # as the gateway does: the tenant's own cache, under the gateway's
        self.cache.for_tenant("default").materialize(
            self.sha, self.archive, self.jobs / record.id / "code"
        )
        ckpt = self.jobs / record.id / "checkpoints"
        ckpt.mkdir()
        (ckpt / "step-10.bin").write_bytes(os.urandom(output_mib * MIB))
        if end is not None:
            self.store.transition(
                record.id,
                JobState.CANCELLED if end is JobState.CANCELLED else JobState.FAILED,
                "ended",
            )
        return record.id

    def gc(self, policy: RetentionPolicy, *, dry_run: bool = False, days_later: float = 0):
        now = __import__("time").time() + days_later * DAY
        return collect_garbage(self.store, self.jobs, self.cache, policy, dry_run=dry_run, now=now)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path)


def test_a_dry_run_says_what_would_go_and_deletes_nothing(home: Home) -> None:
    old = home.job(JobState.FAILED, output_mib=1)
    before = disk_usage([home.root / "jobs", home.root / "code-cache"])
    report = home.gc(
        RetentionPolicy(max_age_s=7 * DAY, include_checkpoints=True), dry_run=True, days_later=8
    )
    assert [j.job_id for j in report.jobs] == [old]
    assert 1 * MIB <= report.jobs[0].bytes < 2 * MIB  # its checkpoint; the code is shared
    # the job's checkpoint and, with no other job linking it, the unpacked bundle
    assert 3 * MIB <= report.bytes_freed <= before
    assert report.bundles == [home.sha]
    assert (home.jobs / old).is_dir() and home.cache.for_tenant("default").tree(home.sha).is_dir()


def test_old_ended_jobs_go_active_and_recent_ones_stay(home: Home) -> None:
    old = home.job(JobState.FAILED)
    running = home.job(None)  # never ended: never touched, however old
    report = home.gc(RetentionPolicy(max_age_s=7 * DAY, include_checkpoints=True), days_later=8)
    assert [j.job_id for j in report.jobs] == [old]
    assert not (home.jobs / old).exists() and (home.jobs / running).is_dir()
    assert report.bundles == []  # the running job still links the bundle's files
    assert home.cache.for_tenant("default").tree(home.sha).is_dir()
    assert home.store.get_job(old) is not None  # the record (and its logs) stay
    assert (
        home.gc(RetentionPolicy(max_age_s=7 * DAY, include_checkpoints=True), days_later=8).jobs
        == []
    )


def test_the_bytes_freed_are_the_bytes_that_left_the_disk(home: Home) -> None:
    home.job(JobState.FAILED, output_mib=1)
    home.job(JobState.CANCELLED, output_mib=1)
    before = disk_usage([home.root / "jobs", home.root / "code-cache"])
    report = home.gc(RetentionPolicy(max_age_s=0, include_checkpoints=True), days_later=1)
    after = disk_usage([home.root / "jobs", home.root / "code-cache"])
    assert len(report.jobs) == 2 and report.bundles == [home.sha]
    assert report.bytes_freed == before - after
    assert after < 64 * 1024 and report.bytes_kept == 0


def test_a_size_cap_removes_the_oldest_ended_jobs_first(home: Home) -> None:
    first = home.job(JobState.FAILED, output_mib=2)
    second = home.job(JobState.FAILED, output_mib=2)
    third = home.job(JobState.FAILED, output_mib=2)
    report = home.gc(RetentionPolicy(max_age_s=None, max_bytes=5 * MIB, include_checkpoints=True))
    assert [j.job_id for j in report.jobs] == [first]
    assert (home.jobs / second).is_dir() and (home.jobs / third).is_dir()
    assert 4 * MIB <= report.bytes_kept <= 5 * MIB


def test_checkpoints_under_an_ended_job_stay_unless_asked_for(home: Home) -> None:
    old = home.job(JobState.FAILED, output_mib=1)
    report = home.gc(RetentionPolicy(max_age_s=7 * DAY), days_later=8)
    assert [j.job_id for j in report.jobs] == [old]
    assert report.jobs[0].bytes < 1 * MIB  # the checkpoint is not counted as going
    assert (home.jobs / old / "checkpoints" / "step-10.bin").stat().st_size == 1 * MIB
    assert not (home.jobs / old / "code").exists()  # the code copy went
    # nothing more to free for it, until checkpoints are included
    assert home.gc(RetentionPolicy(max_age_s=7 * DAY), days_later=8).jobs == []
    report = home.gc(RetentionPolicy(max_age_s=7 * DAY, include_checkpoints=True), days_later=8)
    assert [j.job_id for j in report.jobs] == [old] and not (home.jobs / old).exists()


def test_a_policy_refuses_negative_limits() -> None:
    with pytest.raises(ValueError, match="max_age_s=-1: give 0 or more seconds"):
        RetentionPolicy(max_age_s=-1)


def test_uploaded_archives_no_live_job_names_are_freed(tmp_path: Path) -> None:
    # three one-line edits left three 400 MB uploads behind, and `air gc` freed 0 bytes
    store = SqliteStore(tmp_path / "air.db")
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    archives = {}
    for name in ("old", "live", "fresh"):
        project = tmp_path / name
        project.mkdir()
        (project / "weights.bin").write_bytes(os.urandom(MIB))
        packed = pack_directory(project)
        archives[name] = packed.sha256
        (bundles / f"{packed.sha256}.tar.gz").write_bytes(packed.data)
    ended, _ = store.create_job(
        JobSpec(entrypoint="t.py", bundle_sha256=archives["old"]), tenant="t"
    )
    store.transition(ended.id, JobState.CANCELLED, "ended")
    store.create_job(JobSpec(entrypoint="t.py", bundle_sha256=archives["live"]), tenant="t")
    now = __import__("time").time()
    for name in ("old", "live"):  # uploaded an hour ago; "fresh" just now, for a submit
        os.utime(bundles / f"{archives[name]}.tar.gz", (now - 3600, now - 3600))
    policy = RetentionPolicy(max_age_s=7 * DAY)

    dry = collect_garbage(store, tmp_path / "jobs", BundleCache(tmp_path / "cc"), policy,
                          dry_run=True, bundles_dir=bundles)  # fmt: skip
    assert dry.archives == [archives["old"]] and dry.bytes_freed >= MIB
    assert (bundles / f"{archives['old']}.tar.gz").exists()

    done = collect_garbage(store, tmp_path / "jobs", BundleCache(tmp_path / "cc"), policy,
                           bundles_dir=bundles)  # fmt: skip
    assert done.archives == [archives["old"]]
    left = sorted(p.name.removesuffix(".tar.gz") for p in bundles.iterdir())
    assert left == sorted([archives["live"], archives["fresh"]])
