"""`SqliteStore`: the control-plane store the gateway and the runner hold.

One object over one SQLite database, made of parts that each own one idea and
share its connections (`Database`: WAL, busy_timeout, 0600 files, migrations):

| part | module | owns |
| --- | --- | --- |
| `AuthStore` | `auth.py` | tenants, API tokens (hashed) |
| `BundleIndex` | `bundles.py` | which code bundles a tenant uploaded |
| `JobStore` | `jobs.py` | jobs, their states, the queue order, idempotency |
| `AttemptStore` | `attempts.py` | attempts, worker tokens and their fencing |
| `EventLog` | `events.py` | the per-job event log, worker reports, heartbeats |
| `NodeHealthStore` | `nodes.py` | failures per node |
| `StatsQueries` | `stats.py` | read-only aggregates for SLOs and /metrics |
| `SloBurnStore` | `slo_burns.py` | which tenants' SLOs are burning now |

Callers (gateway, runner, CLI helpers, tests) call the store's methods by their
plain names, `store.get_job(...)`, `store.append_worker_events(...)`: each of
them *is* the owning part's method, bound once here, so its signature and
docstring live in one place and a caller need not know which part owns what.
"""

from __future__ import annotations

from pathlib import Path

from air_sdk.store.attempts import AttemptStore
from air_sdk.store.auth import AuthStore
from air_sdk.store.bundles import BundleIndex
from air_sdk.store.database import Database
from air_sdk.store.events import EventLog
from air_sdk.store.jobs import JobStore
from air_sdk.store.nodes import NodeHealthStore
from air_sdk.store.quota import JobQuotas, QuotaKeeper
from air_sdk.store.secret_env import SecretEnvStore
from air_sdk.store.slo_burns import SloBurnStore
from air_sdk.store.stats import StatsQueries

__all__ = ["SqliteStore"]


class SqliteStore:
    """Tenants and tokens, the bundles index, jobs, attempts, events and node health.

    Example:
        >>> from air_sdk.schema import JobSpec
        >>> store = SqliteStore(":memory:")
        >>> job, created = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
        >>> created, job.state
        (True, <JobState.QUEUED: 'QUEUED'>)
    """

    def __init__(self, path: str | Path, *, quotas: JobQuotas | None = None) -> None:
        self._db = db = Database(path)
        self.path = db.path
        # Secret env values never enter the database (see air_sdk.store.secret_env).
        secrets = SecretEnvStore(None if db.memory else Path(db.path).parent / "secrets")
        events = EventLog(db, secrets, QuotaKeeper(quotas or JobQuotas()))
        auth = AuthStore(db)
        bundles = BundleIndex(db)
        jobs = JobStore(db, events, secrets)
        attempts = AttemptStore(db, events, secrets)
        nodes = NodeHealthStore(db)
        stats = StatsQueries(db)
        slo_burns = SloBurnStore(db)

        #: one transaction around several writes, each its own savepoint (a group commit)
        self.batch = db.batch
        self.batch_now = db.batch_now
        self.checkpoint_in_background = db.checkpoint_in_background

        self.create_tenant = auth.create_tenant
        self.get_tenant = auth.get_tenant
        self.list_tenants = auth.list_tenants
        self.create_token = auth.create_token
        self.issue_token = auth.issue_token
        self.lookup_token = auth.lookup_token
        self.token_exists = auth.token_exists
        self.list_tokens = auth.list_tokens
        self.revoke_token = auth.revoke_token

        self.add_bundle = bundles.add_bundle
        self.get_bundle = bundles.get_bundle

        self.create_job = jobs.create_job
        self.get_job = jobs.get_job
        self.list_jobs = jobs.list_jobs
        self.count_jobs = jobs.count_jobs
        self.transition = jobs.transition
        self.request_cancel = jobs.request_cancel
        self.queue_position = jobs.queue_position
        self.add_transition_listener = jobs.add_transition_listener

        # an ended job fences its attempts' tokens: no remembered verdict survives it
        jobs.add_transition_listener(
            lambda change: attempts.forget_verdicts() if change.job.state.terminal else None
        )
        self.forget_verdicts = attempts.forget_verdicts
        self.start_attempt = attempts.start_attempt
        self.end_attempt = attempts.end_attempt
        self.list_attempts = attempts.list_attempts
        self.attempt_times = attempts.attempt_times
        self.set_resumed_from = attempts.set_resumed_from
        self.crashes_by_tenant = attempts.crashes_by_tenant
        self.check_worker_token = attempts.check_worker_token

        self.append_event = events.append_event
        self.append_worker_events = events.append_worker_events
        self.read_events = events.read_events
        self.last_seq = events.last_seq
        self.heartbeats = events.heartbeats
        self.last_active = events.last_active
        self.finished_ranks = events.finished_ranks
        self.job_redactor = events.job_redactor

        self.record_node_failure = nodes.record_node_failure
        self.node_failures = nodes.node_failures
        self.clear_node_failures = nodes.clear_node_failures

        self.queue_waits = stats.queue_waits
        self.failed_attempts = stats.failed_attempts
        self.ended_jobs = stats.ended_jobs
        self.jobs_by_state = stats.jobs_by_state
        self.store_size_bytes = stats.size_bytes

        self.mark_slo = slo_burns.mark_slo
        self.burning_slos = slo_burns.burning_slos

    def close(self) -> None:
        self._db.close()
