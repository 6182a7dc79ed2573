"""A local gateway's port: taken ports are reported with their holder, and a free one
is picked only when no port was asked for (real sockets, no processes)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from air_sdk.client.local_gateway import start_detached
from air_sdk.client.ports import bind_or_explain, choose_port, port_holder, port_is_free
from air_sdk.errors import ConfigError
from air_sdk.gateway_config import GatewayOptions


@pytest.fixture
def taken() -> Iterator[int]:
    """A port this test process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _default_port_opts(home: Path, port: int) -> GatewayOptions:
    """Options whose port is the default one (not asked for), here `port`."""
    return GatewayOptions.model_construct(_fields_set={"home"}, port=port, home=home)


def test_a_taken_port_names_this_process_as_its_holder(taken: int) -> None:
    me = psutil.Process()
    assert not port_is_free("127.0.0.1", taken)
    assert port_holder("127.0.0.1", taken) == f"{me.name()} (pid {me.pid}, user {me.username()})"


def test_a_holder_whose_pid_is_hidden_is_another_process(
    taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Linux hides the pids of other users' sockets; macOS refuses the listing.
    monkeypatch.setattr(psutil, "net_connections", lambda kind: [])
    assert port_holder("127.0.0.1", taken) == "another process"


def test_an_asked_for_port_that_is_taken_is_refused_with_holder_and_a_free_one(
    taken: int, tmp_path: Path
) -> None:
    opts = GatewayOptions(port=taken, home=tmp_path)
    with pytest.raises(ConfigError) as err:
        choose_port(opts)
    message = str(err.value)
    assert message.startswith(f"port {taken} is taken by {psutil.Process().name()} (pid ")
    assert "choose another with --port" in message and "e.g. --port " in message
    with pytest.raises(ConfigError, match=f"port {taken} is taken by"):
        bind_or_explain(opts)


def test_the_default_port_moves_to_a_free_one_and_says_so(taken: int, tmp_path: Path) -> None:
    choice = choose_port(_default_port_opts(tmp_path, taken))
    assert choice.opts.port != taken and port_is_free("127.0.0.1", choice.opts.port)
    assert choice.note == (
        f"port {taken} is taken by {port_holder('127.0.0.1', taken)}; using"
        f" {choice.opts.port} instead (choose one with --port)"
    )


def test_a_free_port_is_kept_without_a_note(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    choice = choose_port(GatewayOptions(port=port, home=tmp_path))
    assert (choice.opts.port, choice.note) == (port, "")


def test_start_detached_on_a_taken_port_starts_nothing_and_writes_no_config(
    taken: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("AIR_CONFIG_FILE", str(config))
    spawned: list[object] = []
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: spawned.append(a))
    with pytest.raises(ConfigError, match=f"port {taken} is taken"):
        start_detached(GatewayOptions(port=taken, home=tmp_path / "home"))
    assert spawned == [] and not config.exists() and not (tmp_path / "home").exists()
