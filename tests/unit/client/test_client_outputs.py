"""`Job.outputs()` and `Job.download_outputs()` over the mock transport: what lands on
disk, and what a bad listing or a dropped connection leaves behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from air_sdk.client import Client, Job, _http
from air_sdk.client._http import mock_response, mock_session
from air_sdk.errors import TransportError

URL = "http://gw.test"


def gateway(files: dict[str, bytes], *, drop: str | None = None) -> Client:
    listing = {
        "job_id": "j-1",
        "directory": "/home/air/outputs/j-1",
        "files": [{"path": p, "bytes": len(b), "mtime": 1.7e9} for p, b in files.items()],
    }

    def handler(request: requests.PreparedRequest) -> requests.Response:
        path = (request.path_url or "").split("?")[0]
        if path == "/v1/jobs/j-1/outputs":
            return mock_response(200, listing)
        name = path.removeprefix("/v1/jobs/j-1/outputs/files/").replace("%20", " ")
        body = files[name]
        if name == drop:  # half the bytes, then the connection goes
            return mock_response(200, chunks=[body[:3], requests.ConnectionError("reset")])
        return mock_response(200, chunks=[body[:4], body[4:]])

    return Client(URL, token="t", session=mock_session(handler), max_attempts=1)


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    monkeypatch.setattr(_http, "_sleep", lambda s: None)


def test_download_writes_each_file_under_its_path_with_its_mtime(tmp_path):
    files = {"model/weights.bin": b"\x00\x01" * 1000, "eval result.json": b"{}"}
    written = Job(gateway(files), "j-1").download_outputs(tmp_path / "out")
    assert written == [
        tmp_path / "out" / "model/weights.bin",
        tmp_path / "out" / "eval result.json",
    ]
    for name, data in files.items():
        target = tmp_path / "out" / name
        assert target.read_bytes() == data and target.stat().st_mtime == 1.7e9


def test_a_listing_that_leaves_the_destination_writes_nothing_there(tmp_path):
    job = Job(gateway({"../../escape.txt": b"x"}), "j-1")
    with pytest.raises(TransportError, match="outside the download directory"):
        job.download_outputs(tmp_path / "a" / "b")
    assert not (tmp_path / "escape.txt").exists()


def test_a_dropped_download_leaves_no_partial_file(tmp_path):
    job = Job(gateway({"ok.txt": b"fine!", "big.bin": b"0123456789"}, drop="big.bin"), "j-1")
    with pytest.raises(TransportError):
        job.download_outputs(tmp_path)
    assert (tmp_path / "ok.txt").read_bytes() == b"fine!"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.txt"]


def test_outputs_lists_the_files(tmp_path):
    listing = Job(gateway({"a.txt": b"abc"}), "j-1").outputs()
    assert [(f.path, f.bytes) for f in listing.files] == [("a.txt", 3)]
    assert listing.directory == "/home/air/outputs/j-1"


def test_the_default_destination_is_named_after_the_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Job(gateway({"a.txt": b"abc"}), "j-1").download_outputs()
    assert (Path("j-1") / "a.txt").read_bytes() == b"abc"
