"""What a tenant may submit on a shared gateway, and what it sees of the cluster.

The rules are the scheduler's (`air_sdk.scheduler.tenancy`) and the runner's (the
preemption grace cap); this module applies them to a caller, for the routes:

- `check_submit`: a priority above the tenant's cap (the system admin is not capped),
  a `preemption_grace_s` above the operator's cap, or a full queue is refused with the
  setting to change;
- `cluster_view`: the nodes, their use and health as the scheduler sees them (one
  source of truth), with only the caller's own jobs named (a system admin sees all).

Example:
    >>> check_submit(ctx, principal, spec)  # doctest: +SKIP
"""

from __future__ import annotations

from air_sdk.errors import ApiError, ConflictError
from air_sdk.gateway.app import GatewayContext, Principal
from air_sdk.scheduler.tenancy import priority_refusal, queue_refusal
from air_sdk.schema import GpuInfo, Inventory, JobSpec, JobState, NodeInfo

__all__ = ["check_submit", "cluster_view"]


def check_submit(ctx: GatewayContext, principal: Principal, spec: JobSpec) -> None:
    """Refuse (`ApiError` 403, or a `ConflictError` 409 for a full queue) what this
    tenant may not submit."""
    policy = ctx.runner.policy
    if not principal.is_system_admin:
        refusal = priority_refusal(policy, principal.tenant, spec.priority)
        if refusal is not None:
            raise ApiError(403, refusal)
    cap = ctx.runner.max_preemption_grace_s
    if spec.failure.preemption_grace_s > cap:
        raise ApiError(
            403,
            f"preemption_grace_s={spec.failure.preemption_grace_s:g} is over this gateway's"
            f" cap of {cap:g} s: set failure.preemption_grace_s to {cap:g} or less (the"
            " operator sets the cap with `air gateway start --max-preemption-grace-s`)",
        )
    queued = ctx.store.count_jobs(tenant=principal.tenant, states=(JobState.QUEUED,))
    full = queue_refusal(policy, principal.tenant, queued)
    if full is not None:
        raise ConflictError(409, full)


def cluster_view(ctx: GatewayContext, principal: Principal) -> Inventory:
    """The nodes with their use and health; job ids only of the caller's tenant (every
    job's for a system admin)."""
    held = ctx.runner.held_jobs()
    probes = ctx.runner.prober.results() if ctx.runner.prober is not None else {}
    nodes = []
    for n in ctx.runner.inventory():  # health marks included: what the scheduler uses
        here = [(p.job_id, t, a) for p, t in held for a in p.nodes if a.node == n.name]
        shown = {j for j, t, _ in here if principal.is_system_admin or t == principal.tenant}
        nodes.append(
            NodeInfo(
                name=n.name,
                pool=n.pool,
                slots=n.slots,
                gpus=[GpuInfo(index=g) for g in n.gpus],
                used_slots=sum(a.slots for _, _, a in here),
                used_gpus=sorted(g for _, _, a in here for g in a.gpus),
                healthy=n.healthy,
                jobs=sorted(shown),
                probe=probes.get(n.name),
            )
        )
    return Inventory(nodes=nodes)
