"""Submitting: spec checks before upload, bundle dedup, one Idempotency-Key per submit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from air_sdk.bundle import pack_directory
from air_sdk.client import Client, Job, _http
from air_sdk.client._http import mock_response, mock_session
from air_sdk.errors import BundleTooLargeError, SpecError
from air_sdk.schema import JobRecord, JobSpec, JobState

URL = "http://gw.test"


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_http, "_sleep", lambda s: None)


class FakeGateway:
    """Answers bundle and job routes; `fail_posts` 503s the first POSTs."""

    def __init__(self, *, has_bundles: set[str] | None = None, fail_posts: int = 0) -> None:
        self.bundles: dict[str, bytes] = {sha: b"" for sha in has_bundles or set()}
        self.fail_posts = fail_posts
        self.calls: list[requests.PreparedRequest] = []
        self.submitted: list[tuple[str, dict]] = []

    def __call__(self, request: requests.PreparedRequest) -> requests.Response:
        self.calls.append(request)
        path = (request.path_url or "").split("?")[0]
        if path.startswith("/v1/bundles/"):
            sha = path.rsplit("/", 1)[1]
            if request.method == "HEAD":
                return mock_response(200 if sha in self.bundles else 404)
            assert request.headers["Content-Type"] == "application/gzip"
            self.bundles[sha] = request.body  # type: ignore[assignment]
            return mock_response(200, {"sha256": sha, "size": 1, "num_files": 1})
        if request.method == "POST" and path == "/v1/jobs":
            if self.fail_posts:
                self.fail_posts -= 1
                return mock_response(503, {"detail": "restarting"})
            spec = json.loads(request.body)  # type: ignore[arg-type]
            self.submitted.append((request.headers["Idempotency-Key"], spec))
            return mock_response(200, record(f"j-{len(self.submitted)}", spec))
        raise AssertionError(f"unexpected {request.method} {path}")

    def methods(self) -> list[str]:
        return [f"{c.method} {(c.path_url or '').split('?')[0]}" for c in self.calls]


def record(job_id: str, spec: dict, state: JobState = JobState.QUEUED) -> JobRecord:
    now = time.time()
    return JobRecord(
        id=job_id,
        tenant="t",
        name=spec.get("name", "job"),
        state=state,
        spec=JobSpec.model_validate(spec),
        created_at=now,
        updated_at=now,
    )


def client_for(gateway: FakeGateway) -> Client:
    return Client(URL, token="tok", session=mock_session(gateway), max_attempts=4)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "util.py").write_text("X = 1\n")
    return tmp_path


def test_submit_uploads_bundle_then_posts_spec(project: Path) -> None:
    gateway = FakeGateway()
    job = client_for(gateway).submit(JobSpec(entrypoint="train.py"), workdir=project)
    sha = pack_directory(project).sha256
    assert gateway.methods() == [
        f"HEAD /v1/bundles/{sha}",
        f"PUT /v1/bundles/{sha}",
        "POST /v1/jobs",
    ]
    assert gateway.bundles[sha] == pack_directory(project).data
    assert gateway.submitted[0][1]["bundle_sha256"] == sha
    assert isinstance(job, Job) and job.id == "j-1"
    assert repr(job) == "Job(id='j-1', state=QUEUED)"


def test_bundle_upload_skipped_when_gateway_has_it(project: Path) -> None:
    sha = pack_directory(project).sha256
    gateway = FakeGateway(has_bundles={sha})
    client_for(gateway).submit(JobSpec(entrypoint="train.py"), workdir=project)
    assert gateway.methods() == [f"HEAD /v1/bundles/{sha}", "POST /v1/jobs"]


def test_one_idempotency_key_across_retries_new_key_per_submit(project: Path) -> None:
    gateway = FakeGateway(has_bundles={pack_directory(project).sha256}, fail_posts=2)
    client = client_for(gateway)
    client.submit(JobSpec(entrypoint="train.py"), workdir=project)
    posts = [c for c in gateway.calls if c.method == "POST"]
    keys = {c.headers["Idempotency-Key"] for c in posts}
    assert len(posts) == 3 and len(keys) == 1

    client.submit(JobSpec(entrypoint="train.py"), workdir=project)
    assert gateway.submitted[1][0] not in keys


def test_explicit_idempotency_key_is_sent(project: Path) -> None:
    gateway = FakeGateway(has_bundles={pack_directory(project).sha256})
    client_for(gateway).submit(
        JobSpec(entrypoint="train.py"), workdir=project, idempotency_key="k1"
    )
    assert gateway.submitted[0][0] == "k1"


def test_missing_entrypoint_fails_before_any_request(project: Path) -> None:
    gateway = FakeGateway()
    with pytest.raises(SpecError) as info:
        client_for(gateway).submit(JobSpec(entrypoint="nope/train.py"), workdir=project)
    assert str(project / "nope" / "train.py") in str(info.value)
    assert gateway.calls == []


def test_bad_spec_fields_name_the_field_before_any_request(project: Path) -> None:
    gateway = FakeGateway()
    client = client_for(gateway)
    with pytest.raises(SpecError) as info:
        client.submit_script(project / "train.py", nodes=0, env={"RANK": "3"})
    message = str(info.value)
    assert "resources.nodes: Input should be greater than or equal to 1" in message
    assert "env: env RANK is set by AIR" in message
    with pytest.raises(SpecError, match="name"):
        client.submit({"entrypoint": "train.py", "name": "has space"}, workdir=project)
    assert gateway.calls == []


def test_bundle_errors_surface_before_upload(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def too_big(root: Path, **_: object) -> None:
        raise BundleTooLargeError("the bundle is 2.1 GB; the limit is 1 GB")

    monkeypatch.setattr(
        "air_sdk.bundle.scan_directory", too_big
    )  # the limits are checked by the scan
    gateway = FakeGateway()
    with pytest.raises(BundleTooLargeError):
        client_for(gateway).submit(JobSpec(entrypoint="train.py"), workdir=project)
    assert gateway.calls == []


def test_submit_script_builds_the_spec(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "sub").mkdir()
    (project / "sub" / "run.py").write_text("pass\n")
    monkeypatch.chdir(project)
    gateway = FakeGateway()
    client_for(gateway).submit_script(
        "sub/run.py",
        args=["--steps", "3"],
        nodes=2,
        procs_per_node=2,
        env={"FOO": "1"},
        max_restarts=2,
        pool="cpu",
    )
    _, spec = gateway.submitted[0]
    assert spec["entrypoint"] == "sub/run.py"  # relative to the cwd, which holds it
    assert spec["name"] == "run"
    assert spec["args"] == ["--steps", "3"]
    assert spec["resources"] == {"nodes": 2, "procs_per_node": 2, "gpus_per_node": 0}
    assert (spec["env"], spec["max_restarts"], spec["pool"]) == ({"FOO": "1"}, 2, "cpu")
    assert spec["bundle_sha256"] == pack_directory(project).sha256


def test_submit_script_outside_cwd_bundles_its_directory(
    project: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    gateway = FakeGateway()
    client_for(gateway).submit_script(project / "train.py")
    assert gateway.submitted[0][1]["entrypoint"] == "train.py"
    assert gateway.submitted[0][1]["bundle_sha256"] == pack_directory(project).sha256


def test_submit_script_missing_or_outside_workdir(project: Path, tmp_path: Path) -> None:
    client = client_for(FakeGateway())
    with pytest.raises(SpecError, match="not found"):
        client.submit_script(project / "missing.py")
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(SpecError, match="not inside workdir"):
        client.submit_script(project / "train.py", workdir=other)


def test_inline_code_without_workdir_sends_no_bundle() -> None:
    gateway = FakeGateway()
    client_for(gateway).submit(JobSpec(code="print(1)"))
    assert gateway.methods() == ["POST /v1/jobs"]
    assert gateway.submitted[0][1]["bundle_sha256"] is None


def test_an_unchanged_tree_is_not_packed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / "data.bin").write_bytes(b"\0" * (1 << 20))
    gateway = FakeGateway()
    client = Client(URL, "tok", session=mock_session(gateway))
    packed: list[int] = []
    spec = {"entrypoint": "train.py"}

    client.submit(spec, workdir=project, progress=lambda done, total: packed.append(done))
    assert packed and gateway.methods()[:2] == [
        f"HEAD /v1/bundles/{_sha(gateway)}",
        f"PUT /v1/bundles/{_sha(gateway)}",
    ]
    first = gateway.submitted[-1][1]["bundle_sha256"]

    packed.clear()
    gateway.calls.clear()
    client.submit(spec, workdir=project, progress=lambda done, total: packed.append(done))
    assert packed == []  # nothing read or compressed: the bar never shows
    assert gateway.methods() == [f"HEAD /v1/bundles/{first}", "POST /v1/jobs"]
    assert gateway.submitted[-1][1]["bundle_sha256"] == first

    (project / "train.py").write_text("print('changed')\n")  # an edit is packed anew
    client.submit(spec, workdir=project, progress=lambda done, total: packed.append(done))
    assert packed and gateway.submitted[-1][1]["bundle_sha256"] != first

    del gateway.bundles[first]  # the gateway lost it (air gc): packed and sent again
    (project / "train.py").write_text("print('hi')\n")
    import os

    os.utime(project / "train.py", ns=(0, 0))
    client.submit(spec, workdir=project)
    assert gateway.submitted[-1][1]["bundle_sha256"] in gateway.bundles


def _sha(gateway: FakeGateway) -> str:
    return next(iter(gateway.bundles))
