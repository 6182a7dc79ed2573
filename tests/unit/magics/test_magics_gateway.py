"""`%air gateway start|stop|status`: an embedded gateway for the notebook, reused when
one is up, with the client config written so `Client()` finds it (no processes here:
the client-side helper's start/stop functions are replaced; the magic never imports
the gateway)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

import magics.air as air_magics
from air_sdk.client import local_gateway
from air_sdk.client.local_gateway import GatewayProcess
from air_sdk.config import load_client_settings
from air_sdk.errors import TransportError
from air_sdk.gateway_config import GatewayOptions
from air_sdk.schema.api import Health, Inventory, NodeInfo


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    ip = start_ipython() or get_ipython()  # one global test shell per process
    assert ip is not None
    ip.run_line_magic("load_ext", "air_sdk")
    return ip


class FakeServer:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.running: GatewayProcess | None = None
        self.started: list[GatewayOptions] = []

    def running_gateway(self, home: Path) -> GatewayProcess | None:
        assert home == self.home
        return self.running

    def start_detached(self, opts: GatewayOptions) -> GatewayProcess:
        self.started.append(opts)
        self.running = GatewayProcess(
            pid=4242, url=opts.url, token="air_tok", log_path=opts.home / "gateway.log"
        )
        return self.running

    def stop_detached(self, home: Path) -> bool:
        was_running, self.running = self.running is not None, None
        return was_running


class FakeClient:
    def __init__(self, url: str | None, up: bool) -> None:
        self.gateway_url = url or "http://127.0.0.1:8470"
        self.up = up

    def health(self) -> Health:
        if not self.up:
            raise TransportError(f"could not reach the gateway at {self.gateway_url}")
        return Health(version="0.1.0")

    def inventory(self) -> Inventory:
        return Inventory(
            nodes=[
                NodeInfo(name="node-0", slots=1, used_slots=1, jobs=["j-1"]),
                NodeInfo(name="node-1", slots=1),
            ]
        )


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeServer:
    home = tmp_path / "air-home"
    monkeypatch.setenv("AIR_HOME", str(home))
    monkeypatch.setenv("AIR_CONFIG_FILE", str(tmp_path / "config.toml"))
    monkeypatch.delenv("AIR_GATEWAY_URL", raising=False)
    monkeypatch.delenv("AIR_TOKEN", raising=False)
    fake = FakeServer(home)
    for name in ("running_gateway", "start_detached", "stop_detached"):
        monkeypatch.setattr(local_gateway, name, getattr(fake, name))

    def make_client(url: str | None = None, token: str | None = None, **kw: Any) -> FakeClient:
        return FakeClient(url, up=fake.running is not None)

    monkeypatch.setattr(air_magics, "make_client", make_client)
    return fake


def test_start_runs_a_detached_gateway_and_writes_the_client_config(
    shell, fake_server, capsys, tmp_path
):
    shell.run_line_magic("air", "gateway start --nodes 3 --port 8499")

    (opts,) = fake_server.started
    assert (opts.port, opts.num_nodes, opts.home) == (8499, 3, tmp_path / "air-home")
    out = capsys.readouterr().out
    assert "gateway running at http://127.0.0.1:8499 (pid 4242, 3 virtual nodes" in out
    assert "%air gateway stop" in out
    settings = load_client_settings()
    assert (settings.gateway_url, settings.token) == ("http://127.0.0.1:8499", "air_tok")


def test_start_reuses_a_running_gateway(shell, fake_server, capsys):
    shell.run_line_magic("air", "gateway start")
    capsys.readouterr()
    shell.run_line_magic("air", "gateway start")
    assert len(fake_server.started) == 1
    assert "a gateway already runs at http://127.0.0.1:8470 (pid 4242" in capsys.readouterr().out


def test_start_never_reuses_a_gateway_this_home_did_not_start(
    shell, fake_server, capsys, monkeypatch
):
    # another user's gateway answers on the port: its token is not ours, so a gateway of
    # the notebook's own starts (the port was not asked for: the next free one if taken)
    monkeypatch.setattr(air_magics, "make_client", lambda *a, **k: FakeClient(a[0], up=True))
    shell.run_line_magic("air", "gateway start")
    (opts,) = fake_server.started
    assert "port" not in opts.model_fields_set
    assert "gateway running at" in capsys.readouterr().out


def test_stop_leaves_a_gateway_the_notebook_did_not_start(shell, fake_server, capsys):
    fake_server.running = GatewayProcess(
        pid=777, url="http://127.0.0.1:8470", token="cli", log_path=Path("/x")
    )  # started by `air gateway start` in a terminal, from the same home
    shell.run_line_magic("air", "gateway start")
    assert "started outside this notebook" in capsys.readouterr().out
    shell.run_line_magic("air", "gateway stop")
    out = capsys.readouterr().out
    assert "was not started by this notebook: left running" in out
    assert fake_server.running is not None and fake_server.started == []


def test_start_refuses_a_running_gateway_of_another_shape(shell, fake_server, capsys):
    shell.run_line_magic("air", "gateway start")  # 2 nodes x 1 slot (FakeClient.inventory)
    capsys.readouterr()
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("air", "gateway start --nodes 2 --slots-per-node 2")
    message = str(refused.value)
    assert "with 1 slot per node, not 2" in message
    assert "stop it with %air gateway stop and run this cell again" in message
    assert len(fake_server.started) == 1


def test_status_and_stop(shell, fake_server, capsys):
    shell.run_line_magic("air", "gateway status")
    assert "no gateway at http://127.0.0.1:8470; start one with %air gateway start" in (
        capsys.readouterr().out
    )
    shell.run_line_magic("air", "gateway start")
    capsys.readouterr()
    shell.run_line_magic("air", "gateway status")
    assert capsys.readouterr().out.splitlines() == [
        "gateway http://127.0.0.1:8470 is up (version 0.1.0, pid 4242)",
        "  node-0: 1/1 slot  jobs: j-1",
        "  node-1: 0/1 slot",
    ]
    shell.run_line_magic("air", "gateway stop")
    assert "stopped the gateway (pid 4242)" in capsys.readouterr().out
    shell.run_line_magic("air", "gateway stop")
    assert "no gateway is running from" in capsys.readouterr().out
