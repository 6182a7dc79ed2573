"""Tenants' SLOs measured from the store: the samples of each SLO's rolling window
(`air_sdk.store.stats`), their arithmetic (`air_sdk.scheduler.slo`), the `slo` event
when one burns its budget past its threshold, and the words a queued job's
explanation adds when its tenant's queue-wait SLO is at risk.

What each kind measures:

- `queue_wait`: every start of a job (QUEUED -> SCHEDULED), its time in the queue;
- `goodput`: every job that ended after at least one attempt, its productive and lost
  seconds (`air_sdk.runner.accounting`);
- `time_to_detect`: every failed attempt whose failure the runner can date
  (`detection_seconds`): a crash (an OOM, a failed start) from the first failing
  rank's exit, a hang from the moment progress stopped (its hang timeout is part of
  detecting it), a lost node from its last heartbeat, to the runner's verdict.

Example:
    >>> watch = SloWatch(store, policy)  # doctest: +SKIP
    >>> [s.budget_left for s in watch.statuses("acme", now=time.time())]  # doctest: +SKIP
    [0.75]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from air_sdk.runner.accounting import AttemptTimes, account
from air_sdk.scheduler.policy import SchedulerPolicy
from air_sdk.scheduler.slo import (
    Budget,
    Sample,
    SloSpec,
    evaluate,
    goodput_sample,
    latency_sample,
    queue_risk_text,
)
from air_sdk.schema import FailureInfo, JobRecord, JobState, SloBurn, SloBurner, SloStatus
from air_sdk.store import SqliteStore
from air_sdk.store.jobs import Transition
from air_sdk.store.stats import EndedJob

log = logging.getLogger(__name__)

__all__ = ["NOTES_EVERY_S", "SloWatch", "detection_seconds", "ended_job_times", "status"]

#: how old an SLO's measure the queue's explanations may use
NOTES_EVERY_S = 5.0

#: which state changes add a sample to which kind of SLO
_KINDS_OF_CHANGE = {
    JobState.SCHEDULED: ("queue_wait",),
    JobState.RESTARTING: ("time_to_detect",),
    JobState.FAILED: ("time_to_detect", "goodput"),
    JobState.SUCCEEDED: ("goodput",),
    JobState.CANCELLED: ("goodput",),
}


class SloWatch:
    """Evaluates the policy's SLOs over the store and writes `slo` events."""

    def __init__(self, store: SqliteStore, policy: SchedulerPolicy) -> None:
        self.store = store
        self.policy = policy
        #: the queue's notes re-measure an SLO at most every NOTES_EVERY_S
        self._noted: dict[tuple[str, str], tuple[float, Budget]] = {}

    # -- reading ---------------------------------------------------------------------------

    def samples(self, spec: SloSpec, tenant: str, now: float) -> list[Sample]:
        """The samples of `spec`'s window ending `now`, from the store."""
        since = now - spec.window_s
        if spec.kind == "queue_wait":
            return [
                latency_sample(w.job_id, ts=w.scheduled_at, seconds=w.wait_s, target=spec.target)
                for w in self.store.queue_waits(tenant, since)
                if spec.priority is None or w.priority == spec.priority
            ]
        if spec.kind == "time_to_detect":
            out = []
            for f in self.store.failed_attempts(tenant, since):
                seconds = detection_seconds(f.failure, attempt_ended_at=f.ended_at)
                if seconds is not None:
                    out.append(
                        latency_sample(f.job_id, ts=f.ended_at, seconds=seconds, target=spec.target)
                    )
            return out
        return [s for s in map(self._goodput, self.store.ended_jobs(tenant, since)) if s]

    def _goodput(self, ended: EndedJob) -> Sample | None:
        job = self.store.get_job(ended.job_id)
        times = ended_job_times(self.store, job) if job is not None else None
        if job is None or job.ended_at is None or times is None:
            return None
        wall_s, productive_s = times
        return goodput_sample(job.id, ts=job.ended_at, wall_s=wall_s, productive_s=productive_s)

    def budget(self, spec: SloSpec, tenant: str, now: float) -> Budget:
        return evaluate(spec, self.samples(spec, tenant, now), now)

    def statuses(self, tenant: str | None, now: float) -> list[SloStatus]:
        """Every SLO of `tenant` (None: of every tenant), measured now."""
        tenants = [tenant] if tenant is not None else [t.id for t in self.store.list_tenants()]
        out = []
        for t in self.policy.tenants_with_slos(tenants):
            for spec in self.policy.slos_of(t):
                out.append(status(t, spec, self.budget(spec, t, now)))
        return out

    # -- events ----------------------------------------------------------------------------

    def on_transition(self, change: Transition) -> None:
        """A store transition listener: re-measure the SLOs this change adds a sample to,
        and write an `slo` event on the job when one starts burning or recovers."""
        kinds = _KINDS_OF_CHANGE.get(change.job.state)
        if (
            kinds is None
            or change.job.state is JobState.SCHEDULED
            and (change.previous is not JobState.QUEUED)
        ):
            return
        specs = [s for s in self.policy.slos_of(change.job.tenant) if s.kind in kinds]
        if specs:
            self.check(change.job, specs, time.time())

    def check(self, job: JobRecord, specs: Iterable[SloSpec], now: float) -> list[SloBurn]:
        """Measure `specs` of the job's tenant; for each that crossed its threshold, or
        recovered below it, since the last check (by any gateway on this store: the store
        keeps which SLOs burn), write an `slo` event on `job`. Returns the events
        written."""
        written = []
        for spec in specs:
            budget = self.budget(spec, job.tenant, now)
            if self.store.mark_slo(job.tenant, spec.name, burning=budget.burning, now=now):
                burn = SloBurn(
                    tenant=job.tenant,
                    slo=spec.name,
                    kind=spec.kind,
                    target=spec.target,
                    objective=spec.objective,
                    value=budget.value,
                    budget_left=budget.budget_left,
                    burn_rate=budget.burn_rate,
                    threshold=spec.alert_burned,
                    jobs=[job_id for job_id, _ in budget.burners],
                    burning=budget.burning,
                )
                self.store.append_event(job.id, burn, attempt=job.attempt or None)
                how = "is burning" if burn.burning else "recovered"
                log.warning("tenant %s: SLO %r %s: %s", job.tenant, spec.name, how, burn)
                written.append(burn)
        return written

    # -- the queue's words -----------------------------------------------------------------

    def queue_notes(self, queued: Iterable[JobRecord], now: float) -> dict[str, str]:
        """{job id: the words its explanation adds} for queued jobs whose tenant's
        queue-wait SLO is at risk (`air_sdk.scheduler.slo.queue_risk_text`). An SLO is
        measured only for tenants with a job waiting, and at most every NOTES_EVERY_S
        (the scheduling loop asks every tick)."""
        budgets = self._noted
        notes: dict[str, str] = {}
        for job in queued:
            for spec in self.policy.slos_of(job.tenant):
                if spec.kind != "queue_wait" or (
                    spec.priority is not None and job.spec.priority != spec.priority
                ):
                    continue
                key = (job.tenant, spec.name)
                if key not in budgets or now - budgets[key][0] > NOTES_EVERY_S:
                    budgets[key] = (now, self.budget(spec, job.tenant, now))
                text = queue_risk_text(
                    spec, budgets[key][1], tenant=job.tenant, waited_s=now - job.updated_at
                )
                if text is not None:
                    notes[job.id] = text
                    break
        return notes


def detection_seconds(failure: FailureInfo, *, attempt_ended_at: float) -> float | None:
    """How long `failure` went unnoticed: from when it happened (`failed_at`) to the
    runner's verdict (`detected_at`, else the attempt's end); None when the runner could
    not date it (a timeout, a startup that never reported). Failures recorded before
    `failed_at` existed are dated by their first failing rank's exit.

    Example:
        >>> hang = FailureInfo(attempt=1, reason="hung", kind="hang", failed_at=100.0,
        ...                    detected_at=130.0)
        >>> detection_seconds(hang, attempt_ended_at=135.0)
        30.0
        >>> detection_seconds(FailureInfo(attempt=1, reason="?"), attempt_ended_at=1.0) is None
        True
    """
    failed_at = failure.failed_at
    if failed_at is None:
        died = [e.ended_at for e in failure.rank_exits if e.ended_at and not e.ok]
        failed_at = min(died) if died else None
    if failed_at is None:
        return None
    detected_at = failure.detected_at if failure.detected_at is not None else attempt_ended_at
    return max(0.0, detected_at - failed_at)


def ended_job_times(store: SqliteStore, job: JobRecord) -> tuple[float, float] | None:
    """(wall seconds, productive seconds) of an ended job (`air_sdk.runner.accounting`);
    None for one that never ran."""
    if job.ended_at is None or not job.attempt:
        return None
    acc = account(
        store.list_attempts(job.id),
        [AttemptTimes(*row) for row in store.attempt_times(job.id)],
        job_ended_at=job.ended_at,
        now=job.ended_at,
        succeeded=job.state is JobState.SUCCEEDED,
    )
    if acc.wall_s <= 0:
        return None
    return acc.wall_s, sum(acc.productive_s.values())


def status(tenant: str, spec: SloSpec, budget: Budget) -> SloStatus:
    """`budget` of `spec` as the wire shows it."""
    return SloStatus(
        tenant=tenant,
        name=spec.name,
        kind=spec.kind,
        description=spec.describe(),
        target=spec.target,
        objective=spec.objective,
        window_s=spec.window_s,
        value=budget.value,
        num_samples=budget.num_samples,
        budget_left=budget.budget_left,
        burn_rate=budget.burn_rate,
        alert_burned=spec.alert_burned,
        burning=budget.burning,
        burned_by=[SloBurner(job_id=j, burned=b) for j, b in budget.burners],
    )
