"""`air gateway start|stop` as a user sees them: a taken port, jobs that outlive a stop."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from clitest import FakeGateway, flat, invoke

from air_sdk.client import local_gateway
from air_sdk.client.local_gateway import GatewayProcess
from air_sdk.schema import JobState


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_start_on_a_taken_port_names_the_holder_and_writes_no_config(
    taken: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("AIR_CONFIG_FILE", str(config))
    result = invoke("gateway", "start", "--detach", "--port", str(taken), "--home", str(tmp_path))
    assert result.exit_code == 2
    me = psutil.Process()
    assert flat(result.stderr).startswith(
        f"error: port {taken} is taken by {me.name()} (pid {me.pid}, user {me.username()}):"
        " choose another with --port (or AIR_GATEWAY_PORT), e.g. --port "
    )
    assert "Traceback" not in result.output
    assert not config.exists() and not (tmp_path / "gateway.json").exists()


def test_stop_says_that_running_jobs_keep_running_and_how_to_stop_them(
    gateway: FakeGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway.add_job("train-00000001", JobState.RUNNING)
    gateway.add_job("train-00000002", JobState.QUEUED)
    gateway.add_job("train-00000003", JobState.SUCCEEDED)
    proc = GatewayProcess(pid=4242, url="http://gw.test", token="tok", log_path=tmp_path / "log")
    monkeypatch.setattr(local_gateway, "running_gateway", lambda home: proc)
    monkeypatch.setattr(local_gateway, "stop_detached", lambda home: True)
    monkeypatch.setenv("AIR_HOME", str(tmp_path))
    result = invoke("gateway", "stop")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "stopped the gateway (pid 4242)",
        "2 jobs keep running without it (train-00000002, train-00000001): their processes do"
        " not need the gateway, and the next `air gateway start` re-attaches to them. To stop"
        " them: air gateway start --detach && air cancel --all",
    ]


def test_stop_without_jobs_says_only_that_it_stopped(
    gateway: FakeGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = GatewayProcess(pid=4242, url="http://gw.test", token="tok", log_path=tmp_path / "log")
    monkeypatch.setattr(local_gateway, "running_gateway", lambda home: proc)
    monkeypatch.setattr(local_gateway, "stop_detached", lambda home: True)
    monkeypatch.setenv("AIR_HOME", str(tmp_path))
    result = invoke("gateway", "stop")
    assert result.exit_code == 0 and result.stdout == "stopped the gateway (pid 4242)\n"


def test_stop_with_one_job_says_it_in_the_singular(
    gateway: FakeGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway.add_job("train-00000001", JobState.RUNNING)
    proc = GatewayProcess(pid=4242, url="http://gw.test", token="tok", log_path=tmp_path / "log")
    monkeypatch.setattr(local_gateway, "running_gateway", lambda home: proc)
    monkeypatch.setattr(local_gateway, "stop_detached", lambda home: True)
    monkeypatch.setenv("AIR_HOME", str(tmp_path))
    result = invoke("gateway", "stop")
    assert result.stdout.splitlines()[1] == (
        "1 job keeps running without it (train-00000001): its processes do not need the"
        " gateway, and the next `air gateway start` re-attaches to it. To stop it:"
        " air gateway start --detach && air cancel --all"
    )
