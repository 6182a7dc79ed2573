"""What one tenant may ask of a shared cluster, and what it may learn of the others.

Pure rules, used by the gateway at submit and by the runner when it words reasons:

- a tenant's highest priority class (`max_priority` in the cluster file; members of
  a tenant without one get `normal`): above it a submit is refused, so no member can
  preempt another tenant's work by asking for `high`;
- a tenant's cap on queued jobs (`max_queued`, default 1000);
- a tenant's restart allowance (`max_restarts_per_hour`, default none): its jobs'
  charged failures over the last hour (`TenantCrashes`); past it a failing job fails
  with the cap in its reason instead of restarting, so one tenant's crash loops cost
  that tenant, never the nodes of the others;
- another tenant's job is never named: in a queue reason or a preemption event it is
  "another tenant's job" (job ids carry job names).

Example:
    >>> from air_sdk.scheduler.policy import SchedulerPolicy
    >>> priority_refusal(SchedulerPolicy(), "vision", "high")[:46]
    "priority 'high' is above tenant 'vision''s cap"
    >>> mask_foreign_jobs("behind job b-1 (first: b-1)", "a", {"b-1": "b"})
    "behind another tenant's job (first: another tenant's job)"
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from air_sdk.scheduler.gang import PRIORITIES, PRIORITY_RANK
from air_sdk.scheduler.policy import SchedulerPolicy

__all__ = [
    "FOREIGN_JOB",
    "RESTART_WINDOW_S",
    "TenantCrashes",
    "mask_foreign_jobs",
    "priority_refusal",
    "queue_refusal",
]

#: how another tenant's job is shown
FOREIGN_JOB = "another tenant's job"
#: the window a tenant's restart allowance counts over
RESTART_WINDOW_S = 3600.0


@dataclass(frozen=True)
class TenantCrashes:
    """A tenant's charged failures over the last `RESTART_WINDOW_S` against its cap.

    Example:
        >>> c = TenantCrashes("acme", num_crashes=3, cap=2, oldest_ts=0.0)
        >>> print(c.refusal())  # doctest: +ELLIPSIS
        tenant 'acme''s jobs failed 3 times in the last hour, over its cap of 2...
        >>> TenantCrashes("acme", num_crashes=2, cap=2, oldest_ts=0.0).note()
        "tenant 'acme': 2 of 2 restarts in the last hour"
    """

    tenant: str
    #: charged failures of the tenant's jobs in the window (the one just now included)
    num_crashes: int
    #: `max_restarts_per_hour` for the tenant; None: no cap
    cap: int | None
    #: when the oldest of them ended (it leaves the window an hour later)
    oldest_ts: float | None = None

    def refusal(self) -> str | None:
        """Why the failure just counted may not restart its job, or None."""
        if self.cap is None or self.num_crashes <= self.cap:
            return None
        oldest = self.oldest_ts if self.oldest_ts is not None else time.time()
        until = oldest + RESTART_WINDOW_S
        when = time.strftime("%H:%M:%S UTC", time.gmtime(until))
        return (
            f"tenant {self.tenant!r}'s jobs failed {self.num_crashes} times in the last hour,"
            f" over its cap of {self.cap} restarts an hour, so this job is not restarted"
            f" (the oldest of those failures leaves the window at {when}): fix the crash"
            " and submit again, or ask the operator to raise `max_restarts_per_hour` under"
            f" [tenants.{self.tenant}] in the cluster file"
        )

    def note(self) -> str | None:
        """What a restart's reason adds, with a cap: how much of it is used."""
        if self.cap is None:
            return None
        return f"tenant {self.tenant!r}: {self.num_crashes} of {self.cap} restarts in the last hour"


def priority_refusal(policy: SchedulerPolicy, tenant: str, priority: str) -> str | None:
    """Why `tenant` may not submit at `priority` (and what to change), or None."""
    cap = policy.max_priority(tenant)
    if PRIORITY_RANK.get(priority, 0) <= PRIORITY_RANK[cap]:
        return None
    allowed = ", ".join(PRIORITIES[: PRIORITY_RANK[cap] + 1])
    return (
        f"priority {priority!r} is above tenant {tenant!r}'s cap of {cap!r}: submit with"
        f" priority {allowed}, or ask the operator to raise `max_priority` under"
        f" [tenants.{tenant}] in the cluster file"
    )


def queue_refusal(policy: SchedulerPolicy, tenant: str, num_queued: int) -> str | None:
    """Why `tenant`, with `num_queued` jobs waiting, may not queue one more, or None.

    Example:
        >>> queue_refusal(SchedulerPolicy(), "a", 999) is None
        True
    """
    cap = policy.max_queued_for(tenant)
    if num_queued < cap:
        return None
    return (
        f"tenant {tenant!r} has {num_queued} queued jobs, its cap is {cap}: wait for some"
        " to start or cancel some (`air cancel`), or ask the operator to raise"
        f" `max_queued` under [tenants.{tenant}] in the cluster file"
    )


def mask_foreign_jobs(text: str, viewer_tenant: str, tenant_of: Mapping[str, str]) -> str:
    """`text` with every job of a tenant other than `viewer_tenant` (by `tenant_of`, job
    id -> tenant) replaced by "another tenant's job"; a preceding "job " goes too."""
    foreign = [j for j, t in tenant_of.items() if t != viewer_tenant and j in text]
    if not foreign:
        return text
    # Longest first: one id may be a prefix of another.
    ids = "|".join(re.escape(j) for j in sorted(foreign, key=len, reverse=True))
    return re.sub(rf"(?:\bjob )?(?<![\w.-])(?:{ids})(?![\w.-])", FOREIGN_JOB, text)
