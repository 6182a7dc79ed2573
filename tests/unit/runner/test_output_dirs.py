"""Where a job's output directory is, and which of its files may be served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.local import LocalBackend
from air_sdk.runner.backends.ray_rules import check_output_dir
from air_sdk.runner.outputs import OutputDir, default_output_dir, list_outputs
from air_sdk.runner.service import Runner
from air_sdk.scheduler import NodeSpec
from air_sdk.store import SqliteStore


def test_the_default_is_under_the_home_or_the_shared_storage():
    home = Path("/home/air")
    assert default_output_dir(job_id="j1", home=home, storage=None) == "/home/air/outputs/j1"
    assert (
        default_output_dir(job_id="j1", home=home, storage="/mnt/shared/")
        == "/mnt/shared/jobs/j1/outputs"
    )
    assert (
        default_output_dir(job_id="j1", home=home, storage="s3://bucket/air/")
        == "s3://bucket/air/jobs/j1/outputs"
    )


def test_the_runner_places_outputs_outside_the_jobs_files(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    runner = Runner(store, LocalBackend(nodes=[NodeSpec("n0", 1)]), tmp_path, "http://x")
    assert runner.output_storage is None
    assert runner.output_dir("j1") == str(tmp_path / "outputs" / "j1")
    assert not Path(runner.output_dir("j1")).is_relative_to(tmp_path / "jobs")


def test_only_regular_files_inside_are_listed_and_served(tmp_path):
    root = tmp_path / "outputs" / "j1"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.bin").write_bytes(b"12345")
    (root / "top.txt").write_text("t")
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path / "secret", root / "link")
    os.symlink(tmp_path, root / "a" / "up")
    assert [(f.path, f.bytes) for f in list_outputs(root)] == [("a/b/x.bin", 5), ("top.txt", 1)]
    with OutputDir.open(root, tmp_path / "outputs") as out:
        with out.open_file("a/b/x.bin") as f:
            assert f.read() == b"12345"
        for bad in ("../secret", "/etc/passwd", "a/../top.txt", "a\\b", "", "a/b", "a/b/x.bin\x00"):
            with pytest.raises(ConfigError):
                out.open_file(bad)
        for link in ("link", "a/up/secret"):
            with pytest.raises(ConfigError, match="symlink"):
                out.open_file(link)
    assert list_outputs(tmp_path / "outputs" / "never-written") == []


def test_a_root_swapped_for_a_link_is_refused(tmp_path):
    base = tmp_path / "outputs"
    base.mkdir()
    os.symlink(tmp_path, base / "j1")
    with pytest.raises(ConfigError, match="replaced by a link"):
        OutputDir.open(base / "j1", base)
    (base / "j2").mkdir()
    with OutputDir.open(base / "j2", base) as out:
        assert out.path == base / "j2" and out.files() == []


def test_a_fifo_a_job_made_is_refused_without_blocking(tmp_path):
    root = tmp_path / "j1"
    root.mkdir()
    os.mkfifo(root / "pipe")  # opening it for reading would wait for a writer forever
    with OutputDir.open(root, tmp_path) as out, pytest.raises(ConfigError, match="regular"):
        out.open_file("pipe")


def test_a_multi_node_ray_job_must_name_a_shared_output_dir():
    check_output_dir(None, num_nodes=4, storage=None)  # the default: under the storage
    check_output_dir("/local/out", num_nodes=1, storage=None)  # one node: its own disk is fine
    check_output_dir("s3://bucket/out", num_nodes=4, storage=None)
    with pytest.raises(ConfigError, match="start the gateway with AIR_RAY_STORAGE"):
        check_output_dir("/local/out", num_nodes=4, storage=None)
