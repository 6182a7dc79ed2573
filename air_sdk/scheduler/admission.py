"""Before a job is tried: where it may ever go (its route), and whether its tenant
may take more (its quota).

A route is the partitions (pool x accelerator) that could ever hold the job, or the
sentence saying why none can ("never fits", "no pool named ..."); the walk keeps one
per route key for the cycle. Over-quota jobs are skipped with the sentence that says
what to change; they block nobody.

Example:
    >>> from air_sdk.scheduler.gang import JobRequest
    >>> quota_left(TenantQuota(gpus=8), used_gpus=6, used_slots=6)
    (2, inf)
    >>> quota_problem(JobRequest("j", 1, 4, 4), TenantQuota(gpus=8), used_gpus=6, used_slots=6)
    "over quota: tenant 'default' uses 6 of its 8 GPUs; this job needs 4 more"
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from air_sdk.scheduler.capacity import Partition
from air_sdk.scheduler.explain import need_text
from air_sdk.scheduler.gang import ANY_POOL, JobRequest, NodeSpec
from air_sdk.scheduler.policy import TenantQuota
from air_sdk.scheduler.waits import PartitionCycle
from air_sdk.text import plural

__all__ = ["quota_left", "quota_problem", "route"]

_INF = math.inf


def route(
    job: JobRequest, states: Sequence[PartitionCycle], inventory: Sequence[NodeSpec]
) -> list[PartitionCycle] | str:
    """The partitions that could ever hold the job, or why none can."""
    wanted = job.accelerator.lower() if job.accelerator else None
    candidates = []
    for st in states:
        p = st.part
        if job.pool != ANY_POOL and p.pool != job.pool:
            continue
        if wanted is not None and not (
            (wanted == "gpu" and p.has_gpus) or p.accelerator.lower() == wanted
        ):
            continue
        candidates.append(st)
    if not candidates:
        return _no_partition(job, [st.part for st in states], inventory)
    n, s, g = job.shape
    feasible = [st for st in candidates if st.part.can_ever(n, s, g)]
    if feasible:
        return feasible
    best = max(st.part.capable(s, g) for st in candidates)
    where = "any pool" if job.pool == ANY_POOL else f"pool {job.pool!r}"
    return (
        f"never fits: {need_text(job)}; {where} has only {plural(best, 'such healthy node')}:"
        " lower --nodes or the GPUs/ranks per node"
    )


def _no_partition(
    job: JobRequest, partitions: Sequence[Partition], inventory: Sequence[NodeSpec]
) -> str:
    pools = sorted({p.pool for p in partitions})
    if job.pool != ANY_POOL and job.pool not in pools:
        if any(n.pool == job.pool for n in inventory):
            return f"pool {job.pool!r} has no healthy nodes now"
        return f"no pool named {job.pool!r}; pools: {', '.join(pools) or 'none'}"
    kinds = sorted({p.accelerator for p in partitions if job.pool in (ANY_POOL, p.pool)})
    where = "no pool" if job.pool == ANY_POOL else f"pool {job.pool!r}"
    return f"{where} has {job.accelerator!r} nodes; accelerators here: {', '.join(kinds) or 'none'}"


def quota_left(quota: TenantQuota, used_gpus: int, used_slots: int) -> tuple[float, float] | None:
    """(GPUs, slots) a tenant holding `used_*` may still take; None if unlimited."""
    if quota.gpus is None and quota.slots is None:
        return None
    g = _INF if quota.gpus is None else quota.gpus - used_gpus
    s = _INF if quota.slots is None else quota.slots - used_slots
    return (g, s)


def quota_problem(job: JobRequest, quota: TenantQuota, used_gpus: int, used_slots: int) -> str:
    """Why `job` may not start under its tenant's `quota`, and what to change."""
    t = job.tenant
    gpus, slots = job.num_gpus, job.num_slots
    if quota.gpus is not None and gpus > quota.gpus:
        return (
            f"the job needs {plural(gpus, 'GPU')}; tenant {t!r} may hold at most {quota.gpus}:"
            " lower --nodes or --gpus-per-node, or raise the tenant's quota"
        )
    if quota.slots is not None and slots > quota.slots:
        return (
            f"the job needs {plural(slots, 'slot')}; tenant {t!r} may hold at most {quota.slots}:"
            " lower --nodes or --procs-per-node, or raise the tenant's quota"
        )
    if quota.gpus is not None and used_gpus + gpus > quota.gpus:
        return (
            f"over quota: tenant {t!r} uses {used_gpus} of its {plural(quota.gpus, 'GPU')};"
            f" this job needs {gpus} more"
        )
    return (
        f"over quota: tenant {t!r} uses {used_slots} of its {plural(quota.slots or 0, 'slot')};"
        f" this job needs {slots} more"
    )
