"""Pure scheduling decisions: queue + inventory -> placements. No HTTP, SQL or torch.

`decide` is the multi-tenant cycle (priorities, quotas, DRF fair share, EASY
backfill, preemption, routing, explanations); `SchedulerState.decide` is the same
with memory between cycles (for large clusters); `schedule_fifo` is the plain FIFO
gang baseline. `air_sdk.scheduler.sim` replays traces through either.
"""

from air_sdk.scheduler.config import ClusterConfig, load_cluster_config, parse_cluster_config
from air_sdk.scheduler.decide import SchedulerState, decide
from air_sdk.scheduler.decision import Decision, Preemption, Reservation
from air_sdk.scheduler.gang import (
    ANY_POOL,
    MACHINE_CORES_LABEL,
    MACHINE_GPUS_LABEL,
    PRIORITIES,
    JobRequest,
    NodeSpec,
    fits_ever,
    free_capacity,
    place,
    schedule_fifo,
)
from air_sdk.scheduler.policy import SchedulerPolicy, TenantQuota
from air_sdk.scheduler.state import RunningJob

__all__ = [
    "ANY_POOL",
    "MACHINE_CORES_LABEL",
    "MACHINE_GPUS_LABEL",
    "PRIORITIES",
    "ClusterConfig",
    "Decision",
    "JobRequest",
    "NodeSpec",
    "Preemption",
    "Reservation",
    "RunningJob",
    "SchedulerPolicy",
    "SchedulerState",
    "TenantQuota",
    "decide",
    "fits_ever",
    "free_capacity",
    "load_cluster_config",
    "parse_cluster_config",
    "place",
    "schedule_fifo",
]
