"""Tenants, tokens (issued, listed without plaintext, revoked) and secret env values
kept out of the database, in the store alone."""

from __future__ import annotations

import sqlite3

import pytest

from air_sdk.schema import FailureInfo, JobSpec, JobState
from air_sdk.store import SqliteStore


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    return SqliteStore(tmp_path / "air.db" if request.param == "file" else ":memory:")


def test_tokens_are_issued_listed_without_plaintext_and_revoked(store):
    assert store.create_tenant("acme") is not None
    assert store.create_tenant("acme") is None  # exists already
    info, token = store.issue_token("acme", "viewer", "dash")
    assert store.lookup_token(token) == ("acme", "viewer")
    listed = store.list_tokens("acme")
    assert [t.id for t in listed] == [info.id] and listed[0].name == "dash"
    assert token not in repr(listed)
    assert store.revoke_token(info.id, tenant="globex") is None  # not that tenant's
    revoked = store.revoke_token(info.id, tenant="acme")
    assert revoked is not None and revoked.revoked_at is not None
    assert store.lookup_token(token) is None
    assert store.list_tokens("acme") == []
    assert [t.id for t in store.list_tokens("acme", include_revoked=True)] == [info.id]
    assert store.revoke_token(info.id).revoked_at == revoked.revoked_at  # twice: no-op


def test_tokens_need_a_known_tenant_and_role(store):
    with pytest.raises(KeyError):
        store.issue_token("nope", "member")
    with pytest.raises(ValueError, match="role 'root'"):
        store.issue_token("default", "root")


def test_only_digests_are_stored(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    token = store.create_token()
    store.close()
    rows = sqlite3.connect(tmp_path / "air.db").execute("SELECT * FROM tokens").fetchall()
    assert token not in repr(rows)


def test_secret_env_values_stay_out_of_the_database_until_the_job_ends(tmp_path):
    store = SqliteStore(tmp_path / "air.db")
    spec = JobSpec(code="print(1)", env={"DB_PASSWORD": "hunter2-long", "LR": "0.1"})
    job, _ = store.create_job(spec, tenant="default")
    assert job.spec.env == {"DB_PASSWORD": "hunter2-long", "LR": "0.1"}  # for the runner
    raw = sqlite3.connect(tmp_path / "air.db").execute("SELECT spec FROM jobs").fetchone()[0]
    assert "hunter2-long" not in raw and '"DB_PASSWORD":"***"' in raw
    # a restarted gateway (a new store over the same files) still has it
    again = SqliteStore(tmp_path / "air.db")
    assert again.get_job(job.id).spec.env["DB_PASSWORD"] == "hunter2-long"
    failure = FailureInfo(attempt=1, reason="x", log_tail=["pw hunter2-long"])
    again.transition(job.id, JobState.FAILED, "boom", failure=failure)
    ended = again.get_job(job.id)
    assert ended.failure.log_tail == ["pw ***"]
    assert ended.spec.env["DB_PASSWORD"] == "***"  # gone with the job
    assert not list((tmp_path / "secrets").iterdir())


def test_the_same_idempotency_key_with_other_secrets_is_a_conflict(store):
    from air_sdk.store import IdempotencyConflict

    spec = JobSpec(code="print(1)", env={"API_KEY": "first-key"})
    job, created = store.create_job(spec, tenant="default", idempotency_key="k")
    same, again = store.create_job(spec, tenant="default", idempotency_key="k")
    assert created and not again and same.id == job.id
    assert same.spec.env["API_KEY"] == "first-key"
    with pytest.raises(IdempotencyConflict):
        store.create_job(
            JobSpec(code="print(1)", env={"API_KEY": "other-key"}),
            tenant="default",
            idempotency_key="k",
        )
