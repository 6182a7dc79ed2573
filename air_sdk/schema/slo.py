"""Service level objectives on the wire: a tenant's SLO as `air slo` and `/v1/slo` show
it (`SloStatus`), and the event written when one burns its error budget, or recovers
(`SloBurn`).

The arithmetic is `air_sdk.scheduler.slo`; the cluster file declares the SLOs
(docs/operations.md).

Example:
    >>> SloBurn(tenant="acme", slo="queue-wait", kind="queue_wait", target=600.0,
    ...         objective=0.95, value=900.0, budget_left=0.2, burn_rate=0.8,
    ...         threshold=0.5).budget_left
    0.2
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from air_sdk.schema._guards import WireModel
from air_sdk.schema.numbers import NON_FINITE

__all__ = ["MAX_BURNERS", "SloBurn", "SloBurner", "SloKind", "SloReport", "SloStatus"]

#: what an SLO measures: queue wait (seconds, a percentile under a target), goodput (a
#: ratio, at least a target) or the time to detect a failure (seconds, a percentile)
SloKind = Literal["queue_wait", "goodput", "time_to_detect"]
#: the jobs an SLO names as having burned its budget, most first
MAX_BURNERS = 10


class _Wire(WireModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SloBurner(_Wire):
    """One job's share of an SLO's burned budget: for a latency SLO 1 (it waited, or its
    failure went unnoticed, longer than the target), for goodput its lost seconds."""

    job_id: str
    burned: float


class SloStatus(_Wire):
    """One SLO of one tenant over its rolling window.

    `budget_left` is 1 with nothing burned, 0 when the window holds exactly as many bad
    events as the objective allows, and negative past that; `burn_rate` is how fast the
    window spends it (1: exactly the allowed rate).
    """

    tenant: str
    name: str
    kind: SloKind
    description: str = Field(description="e.g. 'p95 queue wait under 10 min (priority high)'")
    target: float = Field(description="Seconds for queue_wait and time_to_detect; a ratio.")
    objective: float = Field(gt=0, lt=1, description="Fraction of events (or time) good.")
    window_s: float = Field(gt=0)
    value: float | None = Field(None, description="The percentile now, or the goodput.")
    num_samples: int = Field(0, ge=0)
    budget_left: float = 1.0
    burn_rate: float = 0.0
    alert_burned: float = Field(description="Burned fraction of the budget that alerts.")
    burning: bool = Field(False, description="Burned past `alert_burned` (an `slo` event).")
    burned_by: list[SloBurner] = Field(default_factory=list, max_length=MAX_BURNERS)


class SloReport(_Wire):
    """The answer of `GET /v1/slo`: the caller's tenant's SLOs (the system admin's: all)."""

    slos: list[SloStatus] = Field(default_factory=list)


class SloBurn(_Wire):
    """A tenant's SLO burned its error budget past its alert threshold (an `slo` event,
    written on the job whose outcome crossed it; once per crossing), or, with `burning`
    False, recovered below it (once per recovery).

    Example:
        >>> SloBurn(tenant="acme", slo="goodput", kind="goodput", target=0.9,
        ...         objective=0.9, value=0.5, budget_left=-3.0, burn_rate=5.0,
        ...         threshold=0.5, jobs=["train-1"]).jobs
        ['train-1']
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)

    tenant: str
    slo: str
    kind: SloKind
    target: float
    objective: float
    value: float | None = None
    budget_left: float
    burn_rate: float
    threshold: float
    #: the jobs that burned the most of it, most first
    jobs: list[str] = Field(default_factory=list, max_length=MAX_BURNERS)
    #: False: the SLO recovered (its burn rate fell below the threshold again)
    burning: bool = True
