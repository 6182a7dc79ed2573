"""A canary secret and a worker token, pushed through every path a job's text takes
(spec env, worker log lines, exit tails, checkpoint records, the shard a rank waits for,
failure records), must
appear in no answer of any route and nowhere in the SQLite files, while the runner
still reads the real value."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from gatewaytest import app_routes

from air_sdk.redact import TOKEN_PATTERN
from air_sdk.schema import FailureInfo, JobState
from air_sdk.store import ACTIVE_STATES


@pytest.fixture
def canary() -> str:
    return f"canary-{secrets.token_hex(8)}"


def _all_answers(tenancy, job_id: str, attempt: int, sha: str) -> dict[str, str]:
    """Every readable answer about the job, from every route the app has."""
    params = {"job_id": job_id, "attempt": attempt, "sha256": sha, "token_id": "0" * 32}
    params["name"] = "node-0"
    params["path"] = "result.txt"
    answers = {}
    for who in ("owner", "viewer", "admin", "sysadmin"):
        client = tenancy.client(who)
        for method, template in sorted(app_routes(tenancy.app)):
            if method not in ("GET", "HEAD") and not template.endswith("/cancel"):
                continue
            path = template.replace(":path}", "}").format(**params)
            r = client.request(method, path)
            answers[f"{who} {method} {path}"] = r.text + "".join(
                f"{k}: {v}\n" for k, v in r.headers.items()
            )
        for variant in ("?tail=5", "?rank=0", "?attempt=1"):
            r = client.get(f"/v1/jobs/{job_id}/logs{variant}")
            answers[f"{who} logs{variant}"] = r.text
    return answers


def test_a_canary_secret_is_in_no_answer_and_not_in_the_database(tenancy, canary):
    owner = tenancy.client("owner")
    sha, _ = tenancy.upload("owner")
    spec = {
        "entrypoint": "train.py",
        "bundle_sha256": sha,
        "env": {"WANDB_API_KEY": canary, "LR": "0.1"},
        "args": ["--lr", "0.1"],
    }
    submitted = owner.post("/v1/jobs", json=spec)
    assert submitted.status_code == 201
    job_id = submitted.json()["id"]
    assert submitted.json()["spec"]["env"] == {"WANDB_API_KEY": "***", "LR": "0.1"}
    again = owner.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "k"})
    assert canary not in again.text

    attempt, worker_token = tenancy.start(job_id)
    # What the runner reads still has the real value: the workers get it.
    assert tenancy.store.get_job(job_id).spec.env["WANDB_API_KEY"] == canary
    active = tenancy.store.list_jobs(states=ACTIVE_STATES)
    assert [j.spec.env["WANDB_API_KEY"] for j in active] == [canary]

    worker = tenancy.client(Authorization=f"Bearer {worker_token}")
    report = {
        "rank": 0,
        "lines": [
            f"wandb: logged in with {canary}",
            f"my token is {worker_token}!",
            f"key={canary};token={worker_token}",
            "an honest line",
        ],
        "exit": {"rank": 0, "exit_code": 1, "tail": [f"Traceback: bad key {canary}"]},
        "checkpoints": [
            {"step": 5, "path": "/ckpt/step-5", "attempt": attempt, "skipped": f"bad {canary}"}
        ],
        "data": {"since": 0.0, "ts": 1.0, "waiting_since": 0.5, "waiting_shard": canary},
    }
    r = worker.post(f"/v1/jobs/{job_id}/attempts/{attempt}/report", json=report)
    assert r.status_code == 204, r.text
    # The runner records a failure whose log tail came from the job's own output.
    failure = FailureInfo(
        attempt=attempt, reason=f"rank 0 said {canary}", log_tail=[canary, worker_token]
    )
    tenancy.store.end_attempt(job_id, attempt, "failed", failure)
    tenancy.store.transition(job_id, JobState.FAILED, "rank 0 failed", failure=failure)

    logs = owner.get(f"/v1/jobs/{job_id}/logs").json()["lines"]
    assert [line["text"] for line in logs] == [
        "wandb: logged in with ***",
        "my token is ***!",
        "key=***;token=***",
        "an honest line",
    ]
    # a worker token the job wrote into its outputs leaves redacted too
    outputs = Path(tenancy.home) / "outputs" / job_id
    outputs.mkdir(parents=True)
    (outputs / "result.txt").write_text(f"acc 0.9 {worker_token}\n")
    answers = _all_answers(tenancy, job_id, attempt, sha)
    served = answers[f"owner GET /v1/jobs/{job_id}/outputs/files/result.txt"]
    assert served.startswith("acc 0.9 ***\n")
    answers["submit"] = submitted.text
    assert len(answers) > 40
    for where, text in answers.items():
        assert canary not in text, where
        assert worker_token not in text, where
        assert TOKEN_PATTERN.search(text) is None, where

    db_files = sorted(Path(tenancy.home).glob("air.db*"))
    assert db_files and any(f.name == "air.db" for f in db_files)
    for f in db_files:
        data = f.read_bytes()
        assert canary.encode() not in data, f.name
        assert worker_token.encode() not in data, f.name
    # The secret's own file (0600) went with the job's end; the queued one's stays.
    vault = Path(tenancy.home) / "secrets"
    assert not (vault / f"{job_id}.json").exists()
    kept = vault / f"{again.json()['id']}.json"
    assert kept.stat().st_mode & 0o777 == 0o600 and vault.stat().st_mode & 0o777 == 0o700


def test_stream_answers_are_scrubbed_too(tenancy, canary):
    job = tenancy.submit("owner", env={"HF_TOKEN": canary})
    attempt, worker_token = tenancy.start(job["id"])
    worker = tenancy.client(Authorization=f"Bearer {worker_token}")
    worker.post(
        f"/v1/jobs/{job['id']}/attempts/{attempt}/report",
        json={"rank": 0, "lines": [f"HF_TOKEN={canary}"]},
    )
    tenancy.store.transition(job["id"], JobState.CANCELLED, "cancelled by user")
    with tenancy.client("owner").stream("GET", f"/v1/jobs/{job['id']}/events/stream") as r:
        body = "".join(r.iter_text())
    assert "HF_TOKEN=***" in body and canary not in body


def test_an_air_token_in_a_plain_env_var_or_arg_is_redacted_in_answers(tenancy):
    leaked = tenancy.tokens["owner"]
    job = tenancy.submit("owner", env={"NOTE": f"use {leaked}"})
    # A value holding a token is a secret whatever its name: not stored either.
    assert leaked.encode() not in (Path(tenancy.home) / "air.db").read_bytes()
    assert tenancy.store.get_job(job["id"]).spec.env["NOTE"] == f"use {leaked}"
    # Args are stored as given (put secrets in env), but no answer shows a token.
    with_arg = tenancy.submit("owner", args=["--auth", leaked])
    for text in (
        tenancy.client("owner").get(f"/v1/jobs/{job['id']}").text,
        tenancy.client("owner").get(f"/v1/jobs/{with_arg['id']}").text,
        tenancy.client("owner").get("/v1/jobs").text,
    ):
        assert leaked not in text
    assert '"NOTE":"use ***"' in tenancy.client("owner").get(f"/v1/jobs/{job['id']}").text
    assert tenancy.store.get_job(with_arg["id"]).spec.args == ["--auth", leaked]


def test_issuing_a_token_is_the_one_answer_that_shows_it(tenancy):
    r = tenancy.client("admin").post("/v1/admin/tokens", json={"role": "viewer"})
    assert r.status_code == 201 and TOKEN_PATTERN.fullmatch(r.json()["token"])


# ---- reports that arrive after the job ended (issue 14, item 4) --------------------------


def _ended_job_with_a_secret(tenancy, canary: str) -> tuple[str, int, str]:
    job = tenancy.submit("owner", env={"WANDB_API_KEY": canary})
    attempt, worker_token = tenancy.start(job["id"])
    tenancy.store.end_attempt(job["id"], attempt, "failed")
    tenancy.store.transition(job["id"], JobState.FAILED, "rank 0 failed")
    return job["id"], attempt, worker_token


def test_a_late_report_after_the_job_ended_is_still_scrubbed(tenancy, canary):
    # The probe: the secrets file goes at the terminal state, but reports are accepted
    # for a grace after it; a line with the secret posted then was stored in clear.
    job_id, attempt, worker_token = _ended_job_with_a_secret(tenancy, canary)
    assert not (Path(tenancy.home) / "secrets" / f"{job_id}.json").exists()  # off disk
    worker = tenancy.client(Authorization=f"Bearer {worker_token}")
    report = {"rank": 0, "lines": [f"last words: {canary}"], "exit": {"rank": 0, "tail": [canary]}}
    r = worker.post(f"/v1/jobs/{job_id}/attempts/{attempt}/report", json=report)
    assert r.status_code == 204, r.text
    logs = tenancy.client("owner").get(f"/v1/jobs/{job_id}/logs").json()["lines"]
    assert [line["text"] for line in logs] == ["last words: ***"]
    events = tenancy.client("owner").get(f"/v1/jobs/{job_id}/events").text
    assert canary not in events
    for f in Path(tenancy.home).glob("air.db*"):
        assert canary.encode() not in f.read_bytes(), f.name


def test_a_report_after_the_grace_is_refused(tenancy, canary, monkeypatch):
    import air_sdk.store.attempts as attempts

    job_id, attempt, worker_token = _ended_job_with_a_secret(tenancy, canary)
    later = attempts.time.time() + attempts.ENDED_GRACE_S + 1
    monkeypatch.setattr(attempts.time, "time", lambda: later)
    worker = tenancy.client(Authorization=f"Bearer {worker_token}")
    r = worker.post(
        f"/v1/jobs/{job_id}/attempts/{attempt}/report",
        json={"rank": 0, "lines": [f"too late: {canary}"]},
    )
    assert r.status_code == 409 and "stop posting" in r.json()["detail"]


def test_a_late_report_that_could_not_be_scrubbed_is_refused(tenancy, canary):
    # A gateway restarted within the grace no longer holds the ended job's secret values
    # (its file went at the end): the report is refused rather than stored in clear.
    from air_sdk.store import SqliteStore

    job_id, attempt, worker_token = _ended_job_with_a_secret(tenancy, canary)
    restarted = SqliteStore(tenancy.store.path)
    assert restarted.check_worker_token(job_id, attempt, worker_token) == "stale"
    # a job without secrets still gets its last lines in after a restart
    plain = tenancy.submit("owner", env={"LR": "0.1"})
    plain_attempt, plain_token = tenancy.start(plain["id"])
    tenancy.store.transition(plain["id"], JobState.SUCCEEDED, "done")
    restarted = SqliteStore(tenancy.store.path)
    assert restarted.check_worker_token(plain["id"], plain_attempt, plain_token) == "ok"


def test_an_ended_jobs_secrets_leave_memory_after_the_grace():
    from air_sdk.store.secret_env import SecretEnvStore

    now = [0.0]
    vault = SecretEnvStore(None, clock=lambda: now[0])
    vault.put("j-1", {"API_KEY": "k-1234"})
    vault.retire("j-1", keep_s=15)
    now[0] = 14.0
    assert vault.to_scrub("j-1") == {"API_KEY": "k-1234"}
    assert vault.get("j-1") == {}  # what the runner reads: nothing launches it again
    now[0] = 16.0
    vault.put("j-2", {"API_KEY": "k-5678"})
    vault.retire("j-2", keep_s=15)
    assert list(vault._retired) == ["j-2"]  # j-1's time was up: dropped, unasked
    assert vault.to_scrub("j-1") == {}
