"""The gateway's services without HTTP (STYLE.md, "Thin routes"): each refusal is an
`AirError` whose message says what to change, and `translate` is the one place that
gives it a status; through the app, the answer is that status and message."""

from __future__ import annotations

import hashlib
import json
import os

import anyio
import pytest
from gatewaytest import Tenancy

from air_sdk.bundle import pack_directory
from air_sdk.errors import (
    AirError,
    ApiError,
    AuthError,
    BundleError,
    BundleTooLargeError,
    ConflictError,
    IdempotencyError,
    NotFoundError,
    SpecError,
    UnsafeBundleError,
)
from air_sdk.gateway.app import Principal
from air_sdk.gateway.services import bundles, outputs, reports, submit
from air_sdk.gateway.translate import detail_of, status_of
from air_sdk.schema import JobSpec

#: a member of tenant acme, as the route passes the caller
ACME = Principal("acme", "member")


def test_each_error_class_has_one_status():
    cases = {
        NotFoundError(404, "no job x"): 404,
        ConflictError(409, "stale"): 409,
        IdempotencyError(422, "key reused"): 422,
        AuthError(401, "bad token"): 401,
        BundleTooLargeError("over 1 GiB"): 413,
        UnsafeBundleError("a link out"): 400,
        BundleError("bad hash"): 400,
        SpecError("needs a bundle"): 400,
        AirError("anything else"): 400,
    }
    assert {type(e).__name__: status_of(e) for e in cases} == {
        type(e).__name__: s for e, s in cases.items()
    }
    assert detail_of(NotFoundError(404, "no job x")) == "no job x"  # no "(HTTP 404)"


def ctx_of(tenancy: Tenancy):
    return tenancy.app.state.air


def test_submit_refusals_say_what_to_change(tenancy):
    ctx = ctx_of(tenancy)
    body = JobSpec(entrypoint="train.py").model_dump_json().encode()
    with pytest.raises(SpecError, match="upload a bundle and set bundle_sha256"):
        submit.submit_job(ctx, ACME, body, "application/json", None)
    missing = JobSpec(entrypoint="train.py", bundle_sha256="a" * 64).model_dump_json().encode()
    with pytest.raises(SpecError, match="was not uploaded: PUT it to /v1/bundles first"):
        submit.submit_job(ctx, ACME, missing, "application/json", None)
    with pytest.raises(ApiError, match="must be JSON") as refused:
        submit.submit_job(ctx, ACME, b"x", "text/plain", None)
    assert refused.value.status == 422
    with pytest.raises(ApiError, match="Idempotency-Key must be") as refused:
        submit.submit_job(ctx, ACME, b"{}", None, "bad\nkey")
    assert refused.value.status == 400


def test_a_repeated_key_returns_the_first_job_and_another_body_is_refused(tenancy):
    ctx = ctx_of(tenancy)
    body = JobSpec(code="print(1)").model_dump_json().encode()
    first, created = submit.submit_job(ctx, ACME, body, None, "k-1")
    again, created_again = submit.submit_job(ctx, ACME, body, None, "k-1")
    assert (created, created_again, again.id) == (True, False, first.id)
    other = JobSpec(code="print(2)").model_dump_json().encode()
    with pytest.raises(IdempotencyError, match="use a new key"):
        submit.submit_job(ctx, ACME, other, None, "k-1")


async def _chunks(data: bytes):
    for i in range(0, len(data), 1000):
        yield data[i : i + 1000]


def test_a_bundle_that_does_not_hash_or_unpack_is_refused(tenancy, monkeypatch):
    ctx = ctx_of(tenancy)
    src = tenancy.home / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    bundle = pack_directory(src)
    wrong = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(BundleError, match="do not hash to the sha256 in the URL"):
        anyio.run(bundles.store_bundle, ctx, "acme", wrong, _chunks(bundle.data))
    with pytest.raises(ApiError, match="64 lowercase hex digits"):
        anyio.run(bundles.store_bundle, ctx, "acme", "x", _chunks(bundle.data))
    monkeypatch.setattr(bundles, "DEFAULT_MAX_BYTES", 100)
    with pytest.raises(BundleTooLargeError, match="add large files to .airignore"):
        anyio.run(bundles.store_bundle, ctx, "acme", bundle.sha256, _chunks(bundle.data))
    assert ctx.store.get_bundle("acme", bundle.sha256) is None
    assert [p.name for p in ctx.bundles_dir.iterdir()] == []  # no .part left behind


def test_a_report_with_a_wrong_or_stale_token_is_refused(tenancy):
    ctx = ctx_of(tenancy)
    job_id = tenancy.submit("owner")["id"]
    attempt, token = tenancy.start(job_id)
    body = json.dumps({"rank": 0, "lines": []}).encode()
    with pytest.raises(AuthError, match="does not belong to this job"):
        reports.prepare_report(ctx, job_id, attempt, "airw_" + "x" * 43, body)
    with pytest.raises(ApiError, match="not a WorkerReport") as refused:
        reports.prepare_report(ctx, job_id, attempt, token, b"{")
    assert refused.value.status == 422


def test_an_output_link_is_not_found_and_a_swapped_directory_a_conflict(tenancy):
    ctx = ctx_of(tenancy)
    job = ctx.store.get_job(tenancy.submit("owner")["id"])
    root = tenancy.home / "outputs" / job.id
    root.mkdir(parents=True)
    os.symlink(tenancy.home / "air.db", root / "db")
    with pytest.raises(NotFoundError, match="'db' is a symlink"):
        outputs.open_job_output(ctx, job, "db")
    assert outputs.job_output_list(ctx, job).files == []
    (root / "db").unlink()
    root.rmdir()
    os.symlink(tenancy.home, root)
    with pytest.raises(ConflictError, match="replaced by a link"):
        outputs.job_output_list(ctx, job)
