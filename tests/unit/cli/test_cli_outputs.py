"""`air outputs JOB` and `air outputs JOB --download [DEST]`, against the real gateway
app in this process (tests/gatewaytest.py), as a user sees them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests
from clitest import flat, invoke
from gatewaytest import Tenancy, tenancy_for

from air_sdk.cli import main as cli
from air_sdk.client import Client, _http
from air_sdk.client._http import mock_response, mock_session


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Tenancy, str]:
    """An acme job with two output files; every `air` command talks to the app as owner."""
    (tmp_path / "home").mkdir()
    tenancy = tenancy_for(tmp_path / "home")
    job_id = tenancy.submit("owner")["id"]
    outputs = tenancy.home / "outputs" / job_id
    (outputs / "model").mkdir(parents=True)
    (outputs / "model" / "weights.bin").write_bytes(os.urandom(3 << 20))
    (outputs / "eval.json").write_text('{"acc": 0.9}\n')
    app = tenancy.client("owner")

    def forward(request: requests.PreparedRequest) -> requests.Response:
        url = (request.url or "").replace("http://gw.test", "")
        r = app.request(request.method or "GET", url, content=request.body)
        return mock_response(r.status_code, content=r.content, headers=dict(r.headers))

    def make_client(gateway: str | None = None, token: str | None = None, **_: object) -> Client:
        return Client("http://gw.test", token="tok", session=mock_session(forward), max_attempts=1)

    monkeypatch.setattr(_http, "_sleep", lambda s: None)
    monkeypatch.setattr(cli, "make_client", make_client)
    monkeypatch.chdir(tmp_path)
    return tenancy, job_id


def test_outputs_lists_each_file_and_says_how_to_fetch_them(served):
    tenancy, job_id = served
    result = invoke("outputs", job_id)
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert "eval.json 13 bytes" in text and "model/weights.bin 3.0 MiB" in text
    assert (
        f"2 files, 3.0 MiB in {tenancy.home / 'outputs' / job_id};"
        f" fetch them with `air outputs {job_id} --download [DEST]`"
    ) in text


def test_download_fetches_identical_bytes_under_their_paths(served, tmp_path):
    tenancy, job_id = served
    result = invoke("outputs", job_id, "--download", "fetched")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "downloaded 2 files (3.0 MiB) to fetched"
    source = tenancy.home / "outputs" / job_id
    for relative in ("eval.json", "model/weights.bin"):
        assert (tmp_path / "fetched" / relative).read_bytes() == (source / relative).read_bytes()
    assert not list((tmp_path / "fetched").rglob("*.part"))


def test_download_defaults_to_a_directory_named_after_the_job(served, tmp_path):
    _, job_id = served
    result = invoke("outputs", job_id, "--download")
    assert result.exit_code == 0, result.output
    assert (tmp_path / job_id / "eval.json").read_text() == '{"acc": 0.9}\n'


def test_a_job_with_nothing_kept_says_how_to_keep_files(served):
    tenancy, _ = served
    empty = tenancy.submit("owner")["id"]
    result = invoke("outputs", empty)
    assert result.exit_code == 0, result.output
    assert "no outputs yet" in result.stdout and "air.output_dir()" in flat(result.stdout)


def test_dest_without_download_is_a_usage_error(served):
    _, job_id = served
    result = invoke("outputs", job_id, "somewhere")
    assert result.exit_code == 2
    assert "add --download" in flat(result.stderr)


def test_another_tenants_job_is_not_found(served):
    tenancy, _ = served
    theirs = tenancy.submit("other")["id"]
    result = invoke("outputs", theirs)
    assert result.exit_code != 0
    assert f"no job '{theirs}'" in flat(result.stderr) or f"no job {theirs}" in flat(result.stderr)
