"""`air admin ...` end to end against a real gateway app (in process: the client's
session forwards every request to a TestClient), as a system admin and as a tenant's."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
import requests
from fastapi.testclient import TestClient
from gatewaytest import BASE_URL, Tenancy, tenancy_for
from typer.testing import CliRunner, Result

from air_sdk.cli import main as cli
from air_sdk.client import Client
from air_sdk.client._http import mock_response, mock_session

runner = CliRunner()


@pytest.fixture
def gw(tmp_path, monkeypatch) -> Tenancy:
    tenancy = tenancy_for(tmp_path)
    inner = TestClient(tenancy.app, base_url=BASE_URL)

    def forward(request: requests.PreparedRequest) -> requests.Response:
        url = urlsplit(request.url or "")
        r = inner.request(
            request.method or "GET",
            url.path + (f"?{url.query}" if url.query else ""),
            content=request.body,
            headers=dict(request.headers),
        )
        return mock_response(r.status_code, content=r.content, headers=dict(r.headers))

    def make_client(gateway=None, token=None, *, max_attempts=6):
        return Client(
            "http://127.0.0.1:8470",
            token=token or tenancy.tokens["sysadmin"],
            session=mock_session(forward),
            max_attempts=1,
        )

    monkeypatch.setattr(cli, "make_client", make_client)
    return tenancy


def air(*args: str) -> Result:
    return runner.invoke(cli.app, list(args), catch_exceptions=False)


def test_a_system_admin_creates_a_tenant_and_its_first_admin(gw):
    r = air("admin", "tenant", "create", "initech")
    assert r.exit_code == 0 and "created tenant initech" in r.output
    r = air("admin", "tenant", "create", "initech")
    assert r.exit_code == 1 and "exists already" in r.output
    r = air("admin", "tenant", "list", "--json")
    assert {"default", "acme", "globex", "initech"} <= {t["id"] for t in json.loads(r.stdout)}
    r = air("admin", "token", "create", "--tenant", "initech", "--role", "admin", "--name", "boss")
    assert r.exit_code == 0
    token = r.stdout.strip()
    assert token.startswith("air_") and "\n" not in token  # alone on stdout
    assert "shown only now" in r.stderr
    assert gw.store.lookup_token(token) == ("initech", "admin")
    assert token not in air("admin", "token", "list", "--tenant", "initech").output


def test_a_token_is_listed_then_revoked_by_id(gw):
    created = json.loads(air("admin", "token", "create", "--role", "viewer", "--json").stdout)
    listed = json.loads(air("admin", "token", "list", "--json").stdout)
    assert created["info"]["id"] in {t["id"] for t in listed}
    r = air("admin", "token", "revoke", created["info"]["id"])
    assert r.exit_code == 0 and "revoked token" in r.output
    assert gw.store.lookup_token(created["token"]) is None
    listed = json.loads(air("admin", "token", "list", "--all", "--json").stdout)
    assert [t["revoked_at"] is not None for t in listed if t["id"] == created["info"]["id"]] == [
        True
    ]
    r = air("admin", "token", "revoke", "0" * 32)
    assert r.exit_code == 1 and "no token" in r.output


def test_a_tenant_admin_only_sees_and_manages_its_own_tenant(gw):
    acme = ("--token", gw.tokens["admin"])
    r = air("admin", "tenant", "list", "--json", *acme)
    assert [t["id"] for t in json.loads(r.stdout)] == ["acme"]
    r = air("admin", "token", "create", "--tenant", "globex", *acme)
    assert r.exit_code == 1 and "no tenant 'globex'" in r.output
    r = air("admin", "tenant", "create", "evil", *acme)
    assert r.exit_code == 1 and "system tenant" in r.output
    r = air("admin", "token", "create", "--role", "member", *acme)
    assert r.exit_code == 0 and gw.store.lookup_token(r.stdout.strip()) == ("acme", "member")


def test_members_and_viewers_are_told_they_need_an_admin_token(gw):
    for who in ("owner", "viewer"):
        r = air("admin", "token", "list", "--token", gw.tokens[who])
        assert r.exit_code == 1 and "needs an admin token" in r.output


def test_a_bad_role_is_a_usage_error(gw):
    r = air("admin", "token", "create", "--role", "root")
    assert r.exit_code == 2 and "use viewer, member, admin or metrics" in r.output


def test_a_node_is_cleared(gw):
    for _ in range(3):
        gw.store.record_node_failure("node-1")
    r = air("admin", "node", "list")
    assert r.exit_code == 0 and "node-1" in r.output
    r = air("admin", "node", "clear", "node-1")
    assert r.exit_code == 0 and "cleared node node-1: healthy" in r.output
    assert gw.store.node_failures() == {}
