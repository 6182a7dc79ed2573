"""`air.output_dir()` (the job's AIR_OUTPUT_DIR) and `air.checkpoint.due(step)` (the
job's --checkpoint-every), as a training script sees them."""

from __future__ import annotations

import pytest

import air_sdk.runtime as air
from air_sdk.errors import CheckpointError, ConfigError


def test_output_dir_is_the_jobs_directory_created(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_OUTPUT_DIR", str(tmp_path / "outputs" / "j1"))
    path = air.output_dir()
    assert path == tmp_path / "outputs" / "j1" and path.is_dir()


def test_output_dir_outside_a_job_is_the_default_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("AIR_OUTPUT_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert air.output_dir().resolve() == tmp_path / "outputs"
    assert air.output_dir("runs/x").resolve() == tmp_path / "runs" / "x"
    assert (tmp_path / "runs" / "x").is_dir()


def test_an_output_url_says_to_write_with_fsspec(monkeypatch):
    monkeypatch.setenv("AIR_OUTPUT_DIR", "s3://bucket/air/jobs/j1/outputs")
    with pytest.raises(ConfigError, match="is a URL.*fsspec"):
        air.output_dir()


def test_due_follows_the_jobs_interval_over_the_codes(monkeypatch):
    monkeypatch.setenv("AIR_CHECKPOINT_EVERY", "3")
    assert [s for s in range(10) if air.checkpoint.due(s, every=100)] == [3, 6, 9]
    monkeypatch.delenv("AIR_CHECKPOINT_EVERY")
    assert [s for s in range(10) if air.checkpoint.due(s, every=4)] == [4, 8]
    assert not any(air.checkpoint.due(s) for s in range(10))  # no interval: never due


def test_due_refuses_a_bad_interval(monkeypatch):
    monkeypatch.setenv("AIR_CHECKPOINT_EVERY", "often")
    with pytest.raises(CheckpointError, match="AIR_CHECKPOINT_EVERY='often' is not a whole number"):
        air.checkpoint.due(1)
    monkeypatch.delenv("AIR_CHECKPOINT_EVERY")
    with pytest.raises(CheckpointError, match="every=0"):
        air.checkpoint.due(1, every=0)
