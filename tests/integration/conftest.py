"""A real gateway (subprocess, free port, temp home) with the local backend: 2 virtual
nodes of 1 slot each, so a 2-node x 1-rank job fills the machine."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from airtest import stop_gateway_and_its_jobs

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, GatewayProcess, start_detached
from air_sdk.runner.backends.local import free_port


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("air-home")
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        # sandboxed jobs may write the tests' tmp_path (outputs they read back)
        sandbox_binds=(tmp_path_factory.getbasetemp(),),
    )
    gw = start_detached(opts)
    yield gw
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


@pytest.fixture(scope="module")
def gateway(gateway_process: GatewayProcess) -> Client:
    return Client(gateway_process.url, gateway_process.token)


@pytest.fixture
def workdir(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a training script into a fresh directory; returns the directory."""

    def write(source: str, name: str = "train.py") -> Path:
        (tmp_path / name).write_text(textwrap.dedent(source))
        return tmp_path

    return write


@pytest.fixture(autouse=True)
def _quiet_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
