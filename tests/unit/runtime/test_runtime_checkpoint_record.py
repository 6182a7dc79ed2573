"""`air.checkpoint.record`: a checkpoint written by a library becomes a CheckpointCommit
(or, resumed from, a CheckpointRestore) in the rank's next report."""

from __future__ import annotations

import pytest
from test_runtime_shipper import FakeGateway

import air_sdk.runtime as air
from air_sdk.runtime import _shipper
from air_sdk.runtime._poster import ReportPoster
from air_sdk.schema.events import CheckpointCommit, CheckpointRestore, WorkerReport


@pytest.fixture
def gateway(monkeypatch):
    monkeypatch.setenv("AIR_ATTEMPT", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    gw = FakeGateway()
    shipper = _shipper.MetricsShipper(0, ReportPoster(gw.report_url, "t"), flush_interval=0.05)
    monkeypatch.setattr(_shipper, "_global", shipper)
    yield gw
    shipper.close(timeout=5)
    gw.close()


def records(gw: FakeGateway) -> list:
    assert _shipper.get_shipper().flush(timeout=15)
    return [c for body in gw.reports for c in WorkerReport.model_validate(body).checkpoints]


def test_a_recorded_directory_is_a_commit_with_its_size_and_a_resume_a_restore(gateway, tmp_path):
    ckpt = tmp_path / "checkpoint-100"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"x" * 1000)
    (ckpt / "sub" / "rng.pth").write_bytes(b"y" * 24)
    air.checkpoint.record(ckpt, step=100, seconds=0.5, source="transformers")
    air.checkpoint.record(str(ckpt), step=100, restored=True)
    assert records(gateway) == [
        CheckpointCommit(
            step=100,
            path=str(ckpt),
            world_size=4,
            size_bytes=1024,
            num_files=2,
            blocked_s=0.5,
            durable_s=0.5,
            attempt=2,
            source="transformers",
        ),
        CheckpointRestore(step=100, path=str(ckpt), attempt=2),
    ]


def test_a_file_counts_as_one_and_a_url_as_unknown_size(gateway, tmp_path):
    (tmp_path / "last.ckpt").write_bytes(b"z" * 7)
    air.checkpoint.record(tmp_path / "last.ckpt", step=3)
    air.checkpoint.record("s3://bucket/ckpt/step-3", step=3)
    found = records(gateway)
    assert [(c.size_bytes, c.num_files) for c in found] == [(7, 1), (0, 0)]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"step": 1.5}, TypeError), ({"step": -1}, ValueError), ({"step": 1, "path": ""}, ValueError)],
)
def test_bad_arguments_say_what_to_change(kwargs, error):
    path = kwargs.pop("path", "/ckpt")
    with pytest.raises(error, match="air.checkpoint.record"):
        air.checkpoint.record(path, **kwargs)


def test_without_a_gateway_nothing_is_sent(monkeypatch, tmp_path):
    monkeypatch.setattr(_shipper, "_global", _shipper.MetricsShipper(0, None))
    air.checkpoint.record(tmp_path, step=1)  # no error, nothing queued
