"""A local gateway whose ranks run unsandboxed serves one tenant unless told otherwise
(issue 14, item 6): any job could read every tenant's secrets and the admin token."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from air_sdk.errors import ConfigError
from air_sdk.gateway.server import build, tenant_refusal
from air_sdk.gateway_config import GatewayOptions
from air_sdk.runner.node.sandbox import Sandbox
from air_sdk.store import SqliteStore


def _opts(home: Path, **more: object) -> GatewayOptions:
    return GatewayOptions(home=home, write_client_config=False, **more)  # type: ignore[arg-type]


def _create_tenant(home: Path, **more: object) -> tuple[int, str]:
    app, token = build(_opts(home, **more))
    client = TestClient(app, base_url="http://127.0.0.1")  # no lifespan: the runner stays off
    response = client.post(
        "/v1/admin/tenants", json={"name": "acme"}, headers={"Authorization": f"Bearer {token}"}
    )
    return response.status_code, response.text


def test_without_a_sandbox_a_second_tenant_is_refused_and_the_message_says_what_to_do(tmp_path):
    status, text = _create_tenant(tmp_path, sandbox="off")
    assert status == 409
    assert "unsandboxed" in text and "apt-get install bubblewrap" in text
    assert "--allow-unsandboxed-tenants" in text


def test_allow_unsandboxed_tenants_lets_the_admin_make_one(tmp_path):
    assert _create_tenant(tmp_path, sandbox="off", allow_unsandboxed_tenants=True)[0] == 201


def test_a_home_that_already_has_tenants_does_not_start_unsandboxed(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    store.create_tenant("acme")
    store.close()
    with pytest.raises(ConfigError, match="more than one tenant.*--allow-unsandboxed-tenants"):
        build(_opts(tmp_path, sandbox="off"))
    build(_opts(tmp_path, sandbox="off", allow_unsandboxed_tenants=True))


@dataclass
class _Backend:
    sandbox: Sandbox


def test_a_sandboxed_local_backend_or_ray_serves_any_number_of_tenants():
    opts = GatewayOptions()
    assert tenant_refusal(opts, _Backend(Sandbox("bwrap", "", "/usr/bin/bwrap"))) is None  # type: ignore[arg-type]
    assert tenant_refusal(opts, object()) is None  # type: ignore[arg-type]  # Ray: no sandbox here
    assert tenant_refusal(opts, _Backend(Sandbox(None, "--sandbox off"))) is not None  # type: ignore[arg-type]
