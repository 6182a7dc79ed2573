"""Attempts: every (re)launch of a job, with its placement, its worker token (stored
hashed) and how it ended; and the fencing of worker reports by attempt.

Example:
    >>> from air_sdk.schema import JobSpec, NodeAssignment, Placement
    >>> from air_sdk.store import SqliteStore
    >>> store = SqliteStore(":memory:")
    >>> job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
    >>> placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
    >>> attempt, token = store.start_attempt(job.id, placement)
    >>> attempt, store.check_worker_token(job.id, attempt, token)
    (1, 'ok')
"""

from __future__ import annotations

import threading
import time

from air_sdk.redact import REDACTED
from air_sdk.schema import AttemptChange, AttemptRecord, FailureInfo, JobSpec, Placement
from air_sdk.store.auth import hash_token, new_token
from air_sdk.store.database import Database
from air_sdk.store.events import EventLog
from air_sdk.store.secret_env import SecretEnvStore

__all__ = ["ENDED_GRACE_S", "SECRETS_MARGIN_S", "AttemptStore"]

#: how long after an attempt ended its ranks may still post (last lines, exit records)
ENDED_GRACE_S = 10.0
#: at most this many "ok" verdicts are remembered (then all are forgotten at once)
MAX_REMEMBERED_VERDICTS = 100_000
#: an ended job's secret values stay in memory this much longer than the grace, so the
#: last report accepted (checked a moment before it is scrubbed) still finds them
SECRETS_MARGIN_S = 5.0


class AttemptStore:
    """Opens and closes a job's attempts and checks the worker tokens they hand out."""

    def __init__(self, db: Database, events: EventLog, secrets: SecretEnvStore) -> None:
        self._db = db
        self._events = events
        self._secrets = secrets
        # "ok" verdicts of attempts that are current and not ended, by (job, attempt,
        # token): every rank posts twice a second, and the SELECT and the digest were a
        # twentieth of a report's cost. Forgotten, all of them, after any commit that
        # could change one (an attempt started or ended, a job ended: `forget_verdicts`);
        # a verdict read before such a commit is kept only if no forgetting happened
        # while it was read (`_generation`), so none outlives the change that ends it.
        self._verdicts: dict[tuple[str, int, str], None] = {}
        self._verdict_lock = threading.Lock()
        self._generation = 0

    def forget_verdicts(self) -> None:
        """Forget every remembered "ok": called after a commit that starts or ends an
        attempt or ends a job (the store calls it; nothing else changes a verdict)."""
        with self._verdict_lock:
            self._generation += 1
            self._verdicts.clear()

    def start_attempt(
        self, job_id: str, placement: Placement, *, resumed_from_step: int | None = None
    ) -> tuple[int, str]:
        """Open the next attempt; returns (attempt number, its worker token)."""
        token = new_token("airw")
        with self._db.tx() as c:
            c.execute("UPDATE jobs SET attempt = attempt + 1 WHERE id = ?", (job_id,))
            attempt = c.execute("SELECT attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
            now = time.time()
            c.execute(
                "INSERT INTO attempts (job_id, attempt, placement, token_hash, started_at,"
                " resumed_from_step) VALUES (?,?,?,?,?,?)",
                (
                    job_id,
                    attempt,
                    placement.model_dump_json(),
                    hash_token(token),
                    now,
                    resumed_from_step,
                ),
            )
            started = AttemptChange(
                attempt=attempt,
                phase="started",
                placement=placement,
                resumed_from_step=resumed_from_step,
            )
            self._events.append(c, job_id, started, attempt=attempt)
        self.forget_verdicts()  # the job's earlier attempts are fenced off from now
        return attempt, token

    def end_attempt(
        self, job_id: str, attempt: int, reason: str, failure: FailureInfo | None = None
    ) -> None:
        if failure is not None:
            failure = self._events.scrub_failure(job_id, failure)
        with self._db.tx() as c:
            c.execute(
                "UPDATE attempts SET ended_at = ?, reason = ?, failure = ? WHERE job_id = ?"
                " AND attempt = ? AND ended_at IS NULL",
                (
                    time.time(),
                    reason,
                    failure.model_dump_json() if failure else None,
                    job_id,
                    attempt,
                ),
            )
            ended = AttemptChange(attempt=attempt, phase="ended", reason=reason)
            self._events.append(c, job_id, ended, attempt=attempt)
        self.forget_verdicts()  # its ranks now post within the grace only

    def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        rows = self._db.read("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,))
        return [
            AttemptRecord(
                job_id=r["job_id"],
                attempt=r["attempt"],
                placement=Placement.model_validate_json(r["placement"]),
                started_at=r["started_at"],
                ended_at=r["ended_at"],
                reason=r["reason"],
                failure=FailureInfo.model_validate_json(r["failure"]) if r["failure"] else None,
                resumed_from_step=r["resumed_from_step"],
            )
            for r in rows
        ]

    def attempt_times(
        self, job_id: str
    ) -> list[tuple[int, float | None, float | None, float | None]]:
        """(attempt, first metrics point time, last checkpoint commit time, time every
        rank was up (RUNNING)) per attempt."""
        rows = self._db.read(
            "SELECT attempt,"
            " MIN(CASE WHEN type = 'metrics' THEN ts END) AS first_progress,"
            " MAX(CASE WHEN type = 'checkpoint' AND json_extract(data, '$.skipped') IS NULL"
            " THEN ts END) AS last_commit,"
            " MIN(CASE WHEN type = 'state' AND json_extract(data, '$.state') = 'RUNNING'"
            " THEN ts END) AS ranks_up"
            " FROM events WHERE job_id = ? AND attempt IS NOT NULL AND type IN"
            " ('metrics', 'checkpoint', 'state') GROUP BY attempt",
            (job_id,),
        )
        return [(r["attempt"], r["first_progress"], r["last_commit"], r["ranks_up"]) for r in rows]

    def crashes_by_tenant(self, since: float) -> dict[str, tuple[int, float]]:
        """tenant -> (attempts of its jobs that ended since `since` with a failure charged
        to their restart budget, when the oldest of them ended); preemptions and other
        uncharged endings do not count (`air_sdk.scheduler.tenancy.TenantCrashes`)."""
        rows = self._db.read(
            "SELECT j.tenant AS tenant, COUNT(*) AS n, MIN(a.ended_at) AS oldest"
            " FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.ended_at >= ?"
            " AND a.failure IS NOT NULL AND json_extract(a.failure, '$.charged') = 1"
            " GROUP BY j.tenant",
            (since,),
        )
        return {r["tenant"]: (r["n"], r["oldest"]) for r in rows}

    def set_resumed_from(self, job_id: str, attempt: int, step: int | None) -> None:
        with self._db.tx() as c:
            c.execute(
                "UPDATE attempts SET resumed_from_step = ? WHERE job_id = ? AND attempt = ?",
                (step, job_id, attempt),
            )

    def check_worker_token(
        self, job_id: str, attempt: int, token: str, *, ended_grace_s: float = ENDED_GRACE_S
    ) -> str:
        """'ok', 'stale' (fenced: a real token of an older attempt, or of an attempt
        or job that ended more than `ended_grace_s` ago) or 'invalid'.

        The grace lets the last lines and the exit record of a rank that just ended
        arrive: refusing every report once the job ends would lose the lines a failing
        rank printed last (its traceback), the ones a user reads first. So an ended
        job's secret values stay in memory for the grace (`SecretEnvStore.retire`),
        and what arrives is scrubbed like any report. When they are gone before the
        grace is (the gateway restarted in between), the report is refused: it could
        not be scrubbed, and nothing unscrubbed is ever stored."""
        key = (job_id, attempt, token)
        if key in self._verdicts:
            return "ok"
        with self._verdict_lock:
            generation = self._generation
        rows = self._db.read(
            "SELECT a.attempt, a.ended_at, j.attempt AS current, j.ended_at AS job_ended"
            " FROM attempts a JOIN jobs j ON j.id = a.job_id"
            " WHERE a.job_id = ? AND a.token_hash = ?",
            (job_id, hash_token(token)),
        )
        if not rows or rows[0]["attempt"] != attempt:
            return "invalid"
        if rows[0]["current"] != attempt:
            return "stale"
        job_ended = rows[0]["job_ended"]
        # A job can end without its attempt being closed (a runner that lost it):
        # the job's end starts the grace too.
        ends = [t for t in (rows[0]["ended_at"], job_ended) if t is not None]
        if not ends:
            with self._verdict_lock:
                if generation == self._generation:
                    if len(self._verdicts) >= MAX_REMEMBERED_VERDICTS:
                        self._verdicts.clear()
                    self._verdicts[key] = None
            return "ok"
        if time.time() - min(ends) > ended_grace_s:
            return "stale"
        if job_ended is not None and not self._secrets_at_hand(job_id):
            return "stale"
        return "ok"

    def _secrets_at_hand(self, job_id: str) -> bool:
        """False when the job has secret env values that this store no longer holds."""
        rows = self._db.read("SELECT spec FROM jobs WHERE id = ?", (job_id,))
        if not rows or REDACTED not in rows[0]["spec"]:
            return True
        env = JobSpec.model_validate_json(rows[0]["spec"]).env
        # A non-secret value that is literally "***" counts too: refusing a late
        # report of such a job after a restart is the safe mistake.
        had_secrets = any(value == REDACTED for value in env.values())
        return not had_secrets or bool(self._secrets.to_scrub(job_id))
