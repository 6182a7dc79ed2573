"""`GET /v1/jobs/{id}/outputs` and `.../outputs/files/{path}`: a tenant lists and
downloads its job's output directory, and nothing outside it."""

from __future__ import annotations

import os

import pytest
from gatewaytest import Tenancy


@pytest.fixture
def job(tenancy: Tenancy) -> tuple[Tenancy, str]:
    job_id = tenancy.submit("owner")["id"]
    outputs = tenancy.home / "outputs" / job_id
    (outputs / "model").mkdir(parents=True)
    (outputs / "model" / "weights.bin").write_bytes(bytes(range(256)) * 4096)
    (outputs / "eval.json").write_text('{"acc": 0.9}\n')
    (tenancy.home / "secret.txt").write_text("the gateway's own file\n")
    return tenancy, job_id


def test_the_owner_lists_the_files_with_size_and_mtime(job):
    tenancy, job_id = job
    r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["directory"] == str(tenancy.home / "outputs" / job_id)
    assert [(f["path"], f["bytes"]) for f in body["files"]] == [
        ("eval.json", 13),
        ("model/weights.bin", 256 * 4096),
    ]
    weights = tenancy.home / "outputs" / job_id / "model" / "weights.bin"
    assert body["files"][1]["mtime"] == pytest.approx(weights.stat().st_mtime)


def test_a_job_that_wrote_nothing_has_an_empty_list(tenancy):
    job_id = tenancy.submit("owner")["id"]
    r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs")
    assert r.status_code == 200 and r.json()["files"] == []


def test_a_download_is_the_files_bytes(job):
    tenancy, job_id = job
    r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs/files/model/weights.bin")
    assert r.status_code == 200
    assert r.content == bytes(range(256)) * 4096
    assert r.headers["content-type"] == "application/octet-stream"


@pytest.mark.parametrize(
    "path", ["%2e%2e/%2e%2e/secret.txt", "..%2F..%2Fsecret.txt", "%2Fetc%2Fpasswd", "model/"]
)
def test_paths_out_of_the_directory_are_refused(job, path):
    tenancy, job_id = job
    r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs/files/{path}")
    assert r.status_code == 404, r.text
    assert "the gateway's own file" not in r.text
    assert f"air outputs {job_id}" in r.json()["detail"]


def test_symlinks_are_neither_listed_nor_served(job):
    tenancy, job_id = job
    outputs = tenancy.home / "outputs" / job_id
    os.symlink(tenancy.home / "secret.txt", outputs / "link.txt")
    os.symlink(tenancy.home, outputs / "home")
    client = tenancy.client("owner")
    listed = [f["path"] for f in client.get(f"/v1/jobs/{job_id}/outputs").json()["files"]]
    assert listed == ["eval.json", "model/weights.bin"]
    for path in ("link.txt", "home/secret.txt"):
        r = client.get(f"/v1/jobs/{job_id}/outputs/files/{path}")
        assert r.status_code == 404 and "symlink" in r.json()["detail"]


def test_a_directory_swapped_for_a_link_is_refused(tenancy):
    job_id = tenancy.submit("owner")["id"]
    (tenancy.home / "outputs").mkdir()
    os.symlink(tenancy.home, tenancy.home / "outputs" / job_id)
    r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs")
    assert r.status_code == 409 and "replaced by a link" in r.json()["detail"]


def test_a_job_with_its_own_output_dir_is_told_where_to_read(tenancy, tmp_path):
    job_id = tenancy.submit("owner", output_dir="/data/runs/7")["id"]
    r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs")
    assert r.status_code == 409
    assert "keeps its outputs in /data/runs/7" in r.json()["detail"]


def test_another_tenant_gets_nothing(job):
    tenancy, job_id = job
    other = tenancy.client("other")
    assert other.get(f"/v1/jobs/{job_id}/outputs").status_code == 404
    assert other.get(f"/v1/jobs/{job_id}/outputs/files/eval.json").status_code == 404


def test_a_token_in_a_file_is_redacted_even_across_reads(job, monkeypatch):
    import air_sdk.gateway.outputs as outputs

    tenancy, job_id = job
    token = "airw_" + "A" * 43
    text = ("x" * 1000 + f" key {token} ") * 3 + "end"
    (tenancy.home / "outputs" / job_id / "log.txt").write_text(text)
    for chunk in (7, 64, 1 << 20):  # tokens cut by a read, and whole in one
        monkeypatch.setattr(outputs.redacted_chunks, "__defaults__", (chunk,))
        r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs/files/log.txt")
        assert r.status_code == 200
        assert r.text == text.replace(token, "***"), chunk


def test_a_large_file_is_streamed_not_sized(job):
    tenancy, job_id = job
    r = tenancy.client("owner").get(f"/v1/jobs/{job_id}/outputs/files/model/weights.bin")
    assert "content-length" not in r.headers  # chunked: the gateway never holds it whole
    assert r.headers["content-disposition"] == "attachment; filename*=UTF-8''weights.bin"
