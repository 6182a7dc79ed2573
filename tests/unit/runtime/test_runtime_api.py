"""`import air_sdk.runtime as air`: the module-level API and the env contract it reads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_runtime_shipper import FakeGateway

import air_sdk.runtime as air
from air_sdk.errors import ConfigError
from air_sdk.runtime import _shipper
from air_sdk.schema.events import WorkerReport

REPO_ROOT = Path(air.__file__).resolve().parents[2]
CONTRACT_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "AIR_JOB_ID",
    "AIR_ATTEMPT",
    "AIR_GATEWAY_URL",
    "AIR_JOB_TOKEN",
    "AIR_CHECKPOINT_DIR",
    "AIR_NODE_NAME",
)


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No launcher env and a fresh process-wide shipper."""
    for name in CONTRACT_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_shipper, "_global", None)
    yield monkeypatch
    if _shipper._global is not None:
        _shipper._global.close(timeout=5)


def test_all_is_sorted_and_every_name_exists() -> None:
    assert air.__all__ == sorted(air.__all__)
    for name in air.__all__:
        assert hasattr(air, name)


def test_importing_the_runtime_and_the_supervisor_does_not_import_torch() -> None:
    code = (
        "import sys, air_sdk.runtime, air_sdk.runtime.supervise\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_context_without_a_launcher_is_a_single_process(bare_env: pytest.MonkeyPatch) -> None:
    ctx = air.context()
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (0, 0, 1, 1)
    assert (ctx.group_rank, ctx.attempt, ctx.restart_count) == (0, 0, 0)
    assert ctx.job_id is None and ctx.gateway_url is None and ctx.checkpoint_dir is None
    assert ctx.node_name  # the host name
    assert air.is_main()


def test_context_reads_the_launcher_env(bare_env: pytest.MonkeyPatch) -> None:
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "AIR_JOB_ID": "job-9",
        "AIR_ATTEMPT": "3",
        "AIR_GATEWAY_URL": "http://127.0.0.1:8470",
        "AIR_JOB_TOKEN": "secret-token",
        "AIR_CHECKPOINT_DIR": "/ckpt/job-9",
        "AIR_NODE_NAME": "node-b",
    }
    for name, value in env.items():
        bare_env.setenv(name, value)
    ctx = air.context()
    assert ctx == air.Context(
        rank=5,
        local_rank=1,
        world_size=8,
        local_world_size=4,
        group_rank=1,
        job_id="job-9",
        attempt=3,
        node_name="node-b",
        checkpoint_dir="/ckpt/job-9",
        gateway_url="http://127.0.0.1:8470",
        restart_count=2,
    )
    assert "secret-token" not in repr(ctx)
    assert not air.is_main()


def test_a_malformed_rank_names_the_variable(bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("RANK", "zero")
    with pytest.raises(ConfigError, match="RANK='zero'"):
        air.context()


def test_log_without_env_is_a_no_op_that_starts_no_thread(bare_env: pytest.MonkeyPatch) -> None:
    before = {thread.name for thread in threading.enumerate()}
    air.log(step=1, loss=0.5)
    air.log(step=2, loss=0.25, lr=0.1)
    air.heartbeat()
    assert air.flush(timeout=1)
    assert {thread.name for thread in threading.enumerate()} == before
    assert _shipper.get_shipper().latest == {"loss": 0.25, "lr": 0.1}


def test_log_with_env_posts_to_this_jobs_attempt(bare_env: pytest.MonkeyPatch) -> None:
    gateway = FakeGateway()
    try:
        for name, value in {
            "RANK": "3",
            "AIR_JOB_ID": "job-7",
            "AIR_ATTEMPT": "2",
            "AIR_GATEWAY_URL": gateway.base_url,
            "AIR_JOB_TOKEN": "tok-7",
        }.items():
            bare_env.setenv(name, value)
        for step in range(3):
            air.log(step=step, loss=1.0 / (step + 1))
        assert air.flush(timeout=10)

        assert gateway.steps() == [0, 1, 2]
        for request in gateway.requests:
            assert request["path"] == "/v1/jobs/job-7/attempts/2/report"
            assert request["auth"] == "Bearer tok-7"
            assert WorkerReport.model_validate(request["body"]).rank == 3
    finally:
        gateway.close()
