"""`GatewayOptions` is the one declaration of a gateway's options: `air gateway start`
has a flag for every field that is not hidden, and every flag lands in its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from air_sdk.bundle import DEFAULT_MAX_BYTES
from air_sdk.cli.main import app
from air_sdk.gateway import server
from air_sdk.gateway_config import DEFAULT_MAX_BUNDLE_BYTES, GatewayOptions, RequestLimits


def _start_params() -> dict[str, Any]:
    command: Any = typer.main.get_command(app)
    start = command.commands["gateway"].commands["start"]
    return {p.name: p for p in start.params if p.name != "help"}


def test_the_bundle_cap_default_is_the_bundle_module_s():
    assert DEFAULT_MAX_BUNDLE_BYTES == DEFAULT_MAX_BYTES == RequestLimits().max_bundle_bytes


def test_every_visible_field_is_a_flag_with_the_field_s_help():
    params = _start_params()
    visible = {n for n in GatewayOptions.model_fields if not GatewayOptions.flag_of(n).hidden}
    assert set(params) - {"detach"} == visible
    assert {"limits", "write_client_config"}.isdisjoint(params)
    for name in visible:
        flag = GatewayOptions.flag_of(name).name or "--" + name.replace("_", "-")
        assert flag in params[name].opts
        assert params[name].help == GatewayOptions.model_fields[name].description


def test_the_flags_given_build_the_options_and_the_rest_keep_env_or_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    seen: list[GatewayOptions] = []
    monkeypatch.setattr(server, "serve", seen.append)
    monkeypatch.setenv("AIR_GATEWAY_SLOTS_PER_NODE", "3")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text("")
    argv = ["gateway", "start", "--port", "9001", "--home", str(tmp_path), "--nodes", "4"]
    argv += ["--allow-host", "a.lan", "--allow-host", "b.lan", "--backend", "local"]
    argv += ["--cluster", str(cluster), "--insecure-bind"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    (opts,) = seen
    assert (opts.port, opts.home, opts.num_nodes) == (9001, tmp_path, 4)
    assert opts.allowed_hosts == ("a.lan", "b.lan") and opts.insecure_bind
    assert opts.cluster_file == cluster and opts.backend == "local"
    assert opts.slots_per_node == 3  # not given: from AIR_GATEWAY_SLOTS_PER_NODE
    assert opts.host == "127.0.0.1" and opts.limits == RequestLimits()


def test_a_flag_out_of_range_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(server, "serve", lambda opts: pytest.fail("started"))
    result = CliRunner().invoke(app, ["gateway", "start", "--port", "0"])
    assert result.exit_code == 2
    text = " ".join(result.output.replace("│", " ").split())
    assert "Invalid value for '--port': Input should be greater than or equal to 1" in text


@pytest.fixture
def two_core_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from air_sdk.runner import devices

    monkeypatch.setattr(devices, "detect_gpus", lambda: [])
    monkeypatch.setattr("os.cpu_count", lambda: 2)


def test_oversubscribe_is_an_option_and_start_warns_about_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_core_machine: None
):
    seen: list[GatewayOptions] = []
    monkeypatch.setattr(server, "serve", seen.append)
    argv = ["gateway", "start", "--home", str(tmp_path), "--oversubscribe"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert seen[0].oversubscribe
    text = " ".join(result.stderr.split())
    assert "warning: oversubscribed: 2 virtual nodes x 2 slots = 4 ranks on 2 cores" in text


def test_the_default_gateway_on_two_cores_runs_one_node_of_two_ranks_without_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_core_machine: None
):
    monkeypatch.setattr(server, "serve", lambda opts: None)
    result = CliRunner().invoke(app, ["gateway", "start", "--home", str(tmp_path)])
    assert result.exit_code == 0 and "warning" not in result.stderr
    backend: Any = server.make_backend(GatewayOptions(home=tmp_path))
    assert [n.slots for n in backend.inventory()] == [2, 2]  # a 1-node x 2-rank job fits
