"""What a user sees when the token is wrong or the gateway is not running."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from clitest import URL, invoke

from air_sdk.cli import main as cli
from air_sdk.client import Client, _http
from air_sdk.client._http import mock_response, mock_session


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A client config with a token this gateway does not know; no AIR_TOKEN."""
    path = tmp_path / "config.toml"
    path.write_text(f'gateway_url = "{URL}"\ntoken = "stale"\n')
    monkeypatch.setenv("AIR_CONFIG_FILE", str(path))
    monkeypatch.delenv("AIR_TOKEN", raising=False)
    monkeypatch.delenv("AIR_GATEWAY_URL", raising=False)
    monkeypatch.setattr(_http, "_sleep", lambda s: None)
    return path


def _serve(monkeypatch: pytest.MonkeyPatch, handler) -> list[requests.PreparedRequest]:  # type: ignore[no-untyped-def]
    seen: list[requests.PreparedRequest] = []

    def record(request: requests.PreparedRequest) -> requests.Response:
        seen.append(request)
        return handler(request)

    def make_client(gateway: str | None = None, token: str | None = None, **kw: object) -> Client:
        return Client(gateway, token, session=mock_session(record), **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(cli, "make_client", make_client)
    return seen


def test_a_wrong_token_is_the_same_message_on_submit_and_on_jobs(
    config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse(request: requests.PreparedRequest) -> requests.Response:
        if request.method == "HEAD":
            return mock_response(401)  # no body: the reason phrase alone said "Unauthorized"
        return mock_response(401, {"detail": "the token is not valid"})

    _serve(monkeypatch, refuse)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    expected = (
        f"error: the gateway at {URL} does not accept the token in {config} (revoked, or"
        " issued by another gateway): `air gateway start` rewrites it for the gateway on this"
        " machine; for another, set AIR_TOKEN to a token it issued (`air admin token create`)"
        " (HTTP 401)"
    )
    submit = invoke("submit", "train.py")
    jobs = invoke("jobs")
    assert (submit.exit_code, jobs.exit_code) == (1, 1)
    assert submit.stderr.strip() == expected == jobs.stderr.strip()


def test_an_empty_air_token_is_unset_and_the_config_token_is_used(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _serve(monkeypatch, lambda r: mock_response(200, {"jobs": []}))
    monkeypatch.setenv("AIR_TOKEN", "")
    result = invoke("jobs")
    assert result.exit_code == 0, result.output
    assert seen[0].headers["Authorization"] == "Bearer stale"


def test_submit_with_the_gateway_stopped_says_so_after_one_try(
    config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    waited: list[float] = []
    monkeypatch.setattr(_http, "_sleep", waited.append)

    def refused(request: requests.PreparedRequest) -> requests.Response:
        raise requests.ConnectionError(
            "Failed to establish a new connection: [Errno 111] Connection refused"
        )

    seen = _serve(monkeypatch, refused)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    result = invoke("submit", "train.py")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: could not reach the gateway at {URL}: Connection refused;"
        " start one with `air gateway start`"
    )
    assert len(seen) == 1 and waited == []
