"""SchedulerPolicy: the knobs of `decide` (quotas, fair-share weights, backfill,
preemption, locality). Plain data; `air_sdk.scheduler.config` loads it from TOML."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from air_sdk.scheduler.gang import PRIORITIES
from air_sdk.scheduler.slo import SloSpec


@dataclass(frozen=True, kw_only=True)
class TenantQuota:
    """Hard limits on what one tenant may hold at once, over all pools.

    Example:
        >>> TenantQuota(gpus=8).slots is None  # no cap on rank slots
        True
    """

    #: GPUs the tenant's running jobs may hold together; None is unlimited
    gpus: int | None = None
    #: rank slots (CPU jobs use slots only); None is unlimited
    slots: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("gpus", self.gpus), ("slots", self.slots)):
            if value is not None and value < 0:
                raise ValueError(f"quota {name}={value} is negative: give 0 or more, or omit it")


UNLIMITED = TenantQuota()
#: queued jobs one tenant may have when the cluster file sets no `max_queued`
DEFAULT_MAX_QUEUED = 1000


@dataclass(frozen=True, kw_only=True)
class SchedulerPolicy:
    """How `decide` orders, admits and places jobs.

    Example:
        >>> p = SchedulerPolicy(quotas={"vision": TenantQuota(gpus=16)}, weights={"vision": 2})
        >>> p.quota("vision").gpus, p.quota("nlp").gpus, p.weight("vision")
        (16, None, 2.0)
    """

    #: per-tenant hard limits; tenants not named get `default_quota`
    quotas: Mapping[str, TenantQuota] = field(default_factory=dict)
    #: the limits of tenants without an entry in `quotas` (default: unlimited)
    default_quota: TenantQuota = UNLIMITED
    #: fair-share weights (a tenant with weight 2 is entitled to twice the share); default 1
    weights: Mapping[str, float] = field(default_factory=dict)
    #: "drf": within a priority class, the tenant with the lowest dominant share goes
    #: first; "fifo": submit order only (no fair share)
    fair_share: Literal["drf", "fifo"] = "drf"
    #: EASY backfill: later jobs may start before a blocked head job if they do not
    #: delay it (they end before its reservation, or use capacity it does not need)
    backfill: bool = True
    #: let jobs of `preemptor_priorities` preempt running jobs of strictly lower priority
    preemption: bool = True
    #: priority classes allowed to preempt
    preemptor_priorities: frozenset[str] = frozenset({"high"})
    #: against starvation: a job that has waited this long is ordered one priority class
    #: higher (two after twice as long), up to the class below the lowest preemptor
    #: class; None: never. Preemption rights and protection keep the job's own class.
    aging_s: float | None = 24 * 3600.0
    #: a multi-node gang prefers nodes that share this label's value (e.g. one region)
    locality_label: str | None = "region"
    #: with a locality label: never span label values (wait instead)
    locality_strict: bool = False
    #: per-tenant highest priority class a submit may ask for (`air_sdk.scheduler.tenancy`)
    max_priorities: Mapping[str, str] = field(default_factory=dict)
    #: ... for tenants without an entry there: no member may preempt another tenant
    default_max_priority: str = "normal"
    #: per-tenant cap on queued jobs
    max_queued: Mapping[str, int] = field(default_factory=dict)
    #: ... for tenants without an entry there
    default_max_queued: int = DEFAULT_MAX_QUEUED
    #: per-tenant service level objectives (`air_sdk.scheduler.slo`)
    slos: Mapping[str, tuple[SloSpec, ...]] = field(default_factory=dict)
    #: ... for tenants without an entry there
    default_slos: tuple[SloSpec, ...] = ()
    #: per-tenant cap on charged failures (crashes, hangs) of its jobs over the last
    #: hour; past it the tenant's failing jobs fail instead of restarting
    max_restarts_per_hour: Mapping[str, int] = field(default_factory=dict)
    #: ... for tenants without an entry there (None: no cap)
    default_max_restarts_per_hour: int | None = None

    def __post_init__(self) -> None:
        if self.fair_share not in ("drf", "fifo"):
            raise ValueError(f"fair_share={self.fair_share!r}: use 'drf' or 'fifo'")
        unknown = set(self.preemptor_priorities) - set(PRIORITIES)
        if unknown:
            raise ValueError(
                f"preemptor_priorities {sorted(unknown)} are not priority classes;"
                f" use some of {', '.join(PRIORITIES)}"
            )
        if self.aging_s is not None and not self.aging_s > 0:
            raise ValueError(f"aging_s={self.aging_s}: give a positive number of seconds or None")
        for tenant, p in {**self.max_priorities, "*": self.default_max_priority}.items():
            if p not in PRIORITIES:
                raise ValueError(
                    f"max_priority {p!r} of tenant {tenant!r} is not a priority class;"
                    f" use one of {', '.join(PRIORITIES)}"
                )
        for tenant, n in {**self.max_queued, "*": self.default_max_queued}.items():
            if n < 1:
                raise ValueError(f"max_queued of tenant {tenant!r} is {n}: give 1 or more")
        for tenant, r in {
            **self.max_restarts_per_hour,
            "*": self.default_max_restarts_per_hour,
        }.items():
            if r is not None and r < 0:
                raise ValueError(
                    f"max_restarts_per_hour of tenant {tenant!r} is {r}: give 0 or more"
                )
        for tenant, w in self.weights.items():
            if not w > 0:
                raise ValueError(f"weight of tenant {tenant!r} is {w}: weights must be > 0")

    def quota(self, tenant: str) -> TenantQuota:
        return self.quotas.get(tenant, self.default_quota)

    def weight(self, tenant: str) -> float:
        return float(self.weights.get(tenant, 1.0))

    def max_priority(self, tenant: str) -> str:
        return self.max_priorities.get(tenant, self.default_max_priority)

    def max_queued_for(self, tenant: str) -> int:
        return self.max_queued.get(tenant, self.default_max_queued)

    def slos_of(self, tenant: str) -> tuple[SloSpec, ...]:
        """The tenant's SLOs: its own, else the '*' entry's."""
        return self.slos.get(tenant, self.default_slos)

    def tenants_with_slos(self, tenants: Iterable[str]) -> list[str]:
        """Those of `tenants` with at least one SLO, in order."""
        return [t for t in tenants if self.slos_of(t)]

    def restarts_per_hour_for(self, tenant: str) -> int | None:
        """The tenant's restart allowance per hour, None for no cap."""
        return self.max_restarts_per_hour.get(tenant, self.default_max_restarts_per_hour)
