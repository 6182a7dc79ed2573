"""Where a gateway may listen: loopback always; anything else only with TLS or an
explicit --insecure-bind; TLS reaches uvicorn; options survive a detached start (as JSON,
not argv) and can come from AIR_GATEWAY_* env vars."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from air_sdk.client import local_gateway
from air_sdk.errors import AirError
from air_sdk.gateway import server
from air_sdk.gateway.options import RateLimit, RequestLimits, check_bind, is_loopback
from air_sdk.gateway_config import OPTIONS_ENV, GatewayOptions


@pytest.fixture
def tls(tmp_path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    return cert, key


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "localhost", "::1", "[::1]"])
def test_loopback_is_always_allowed(host):
    assert is_loopback(host)
    check_bind(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "gpu-box.lan"])
def test_any_other_address_needs_tls_or_an_explicit_insecure_bind(host, tls):
    with pytest.raises(AirError, match="--tls-cert and --tls-key, or --insecure-bind"):
        check_bind(host)
    check_bind(host, insecure_bind=True)
    check_bind(host, tls_cert=tls[0], tls_key=tls[1])


def test_half_a_tls_pair_or_a_missing_file_is_refused(tls, tmp_path):
    with pytest.raises(AirError, match="both"):
        check_bind("0.0.0.0", tls_cert=tls[0])
    with pytest.raises(AirError, match="not a readable file"):
        check_bind("0.0.0.0", tls_cert=tmp_path / "nope.pem", tls_key=tls[1])


def test_build_refuses_an_open_bind_and_serves_the_configured_host(tmp_path):
    with pytest.raises(AirError, match="refusing to listen on 0.0.0.0"):
        server.build(GatewayOptions(host="0.0.0.0", home=tmp_path, write_client_config=False))
    opts = GatewayOptions(host="0.0.0.0", home=tmp_path, insecure_bind=True)
    app, token = server.build(opts)
    assert token.startswith("air_")
    hosts = server.security_options(opts).all_hosts()
    assert "0.0.0.0" in hosts and "[::1]" in hosts
    assert opts.worker_url.startswith("http://127.0.0.1:")


def test_tls_reaches_uvicorn_and_makes_the_url_https(tmp_path, tls, monkeypatch):
    seen = {}
    monkeypatch.setattr("uvicorn.Server.run", lambda self, sockets: seen.update(vars(self.config)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    opts = GatewayOptions(
        host="0.0.0.0",
        port=port,
        home=tmp_path,
        tls_cert=tls[0],
        tls_key=tls[1],
        write_client_config=False,
    )
    assert opts.url == f"https://0.0.0.0:{port}"
    server.serve(opts)
    assert seen["ssl_certfile"] == str(tls[0]) and seen["ssl_keyfile"] == str(tls[1])
    assert seen["host"] == "0.0.0.0" and seen["server_header"] is False


def test_a_detached_gateway_gets_every_option_as_data(tmp_path, tls, monkeypatch):
    seen: list[GatewayOptions] = []
    spawned: list[dict[str, str]] = []
    monkeypatch.setattr(server, "serve", seen.append)
    limits = RequestLimits(user_rate=RateLimit(per_s=5, burst=7), anonymous_rate=None)
    opts = GatewayOptions(
        host="0.0.0.0",
        port=9,
        home=tmp_path,
        tls_cert=tls[0],
        tls_key=tls[1],
        allowed_hosts=("gpu-box.lan",),
        cors_origins=("https://lab.example",),
        limits=limits,
        num_nodes=3,
        slots_per_node=2,
        write_client_config=False,
    )

    class Spawned:
        pid, returncode = 4242, 1

        def __init__(self, cmd, *, env, **kw):
            assert cmd[1:] == ["-m", "air_sdk.gateway.server"]  # no option travels as argv
            spawned.append(env)

        def poll(self):
            return 1  # "exited": the test runs the child's main() itself below

    monkeypatch.setattr(local_gateway.subprocess, "Popen", Spawned)
    with pytest.raises(AirError, match="the gateway exited with code 1"):
        local_gateway.start_detached(opts)

    monkeypatch.setenv(OPTIONS_ENV, spawned[0][OPTIONS_ENV])
    server.main()
    assert seen == [opts]
    assert seen[0].limits == limits and seen[0].allowed_hosts == ("gpu-box.lan",)


def test_a_gateway_without_options_json_reads_its_env(tmp_path, monkeypatch):
    seen: list[GatewayOptions] = []
    monkeypatch.setattr(server, "serve", seen.append)
    monkeypatch.delenv(OPTIONS_ENV, raising=False)
    monkeypatch.setenv("AIR_GATEWAY_PORT", "9123")
    monkeypatch.setenv("AIR_GATEWAY_HOME", str(tmp_path))
    monkeypatch.setenv("AIR_GATEWAY_ALLOWED_HOSTS", '["gpu-box.lan"]')
    server.main()
    assert (seen[0].port, seen[0].home, seen[0].allowed_hosts) == (9123, tmp_path, ("gpu-box.lan",))


def test_air_gateway_start_refuses_an_open_host_with_the_fix(tmp_path):
    from air_sdk.cli.main import app

    result = CliRunner().invoke(
        app, ["gateway", "start", "--host", "0.0.0.0", "--home", str(tmp_path)]
    )
    assert result.exit_code == 1
    assert "--insecure-bind" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "air.db").exists()
