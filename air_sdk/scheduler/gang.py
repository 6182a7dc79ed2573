"""Gang placement over an inventory of nodes: a pure function of queue + inventory.

A job asks for `nodes` distinct nodes, each with `slots` free rank slots and
`gpus` free GPUs. It gets all of them at once or none (gang). The queue is FIFO
within the pool: the head of the queue that does not fit blocks the jobs behind
it, so a large job is never starved by a stream of small ones (backfill that
provably does not delay the head comes with the multi-tenant scheduler).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from air_sdk.schema import NodeAssignment, Placement


@dataclass(frozen=True)
class NodeSpec:
    """One schedulable node: a real machine, or a "virtual node" on this machine.

    Example:
        >>> NodeSpec(name="node-0", slots=4, gpus=(0, 1)).num_gpus
        2
    """

    name: str
    slots: int
    gpus: tuple[int, ...] = ()
    pool: str = "default"
    healthy: bool = True

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class JobRequest:
    """What the scheduler needs to know of a queued job."""

    job_id: str
    nodes: int
    slots_per_node: int
    gpus_per_node: int = 0
    pool: str = "default"


@dataclass
class _Free:
    slots: int
    gpus: list[int] = field(default_factory=list)


def free_capacity(
    inventory: Sequence[NodeSpec], allocations: Iterable[Placement]
) -> dict[str, _Free]:
    """Free slots and GPUs per healthy node, given the placements currently held."""
    free = {n.name: _Free(n.slots, list(n.gpus)) for n in inventory if n.healthy}
    for placement in allocations:
        for a in placement.nodes:
            f = free.get(a.node)
            if f is None:
                continue  # node gone or unhealthy: nothing to give back
            f.slots -= a.slots
            f.gpus = [g for g in f.gpus if g not in a.gpus]
    return free


def place(
    request: JobRequest, inventory: Sequence[NodeSpec], free: Mapping[str, _Free]
) -> Placement | None:
    """A gang placement for `request` on distinct nodes, or None if it does not fit.

    Prefers the fullest nodes that still fit (best fit), which leaves whole nodes
    free for the next large job.

    Example:
        >>> inv = [NodeSpec("a", 1), NodeSpec("b", 1)]
        >>> p = place(JobRequest("j", nodes=2, slots_per_node=1), inv, free_capacity(inv, []))
        >>> [n.node for n in p.nodes]
        ['a', 'b']
    """
    candidates = [
        n
        for n in inventory
        if n.healthy
        and n.pool == request.pool
        and n.name in free
        and free[n.name].slots >= request.slots_per_node
        and len(free[n.name].gpus) >= request.gpus_per_node
    ]
    if len(candidates) < request.nodes:
        return None
    candidates.sort(key=lambda n: (free[n.name].slots, len(free[n.name].gpus), n.name))
    chosen = sorted(candidates[: request.nodes], key=lambda n: n.name)
    return Placement(
        job_id=request.job_id,
        pool=request.pool,
        nodes=tuple(
            NodeAssignment(
                node=n.name,
                slots=request.slots_per_node,
                gpus=tuple(free[n.name].gpus[: request.gpus_per_node]),
            )
            for n in chosen
        ),
    )


def fits_ever(request: JobRequest, inventory: Sequence[NodeSpec]) -> str | None:
    """None if an empty cluster could run the job, else the reason it never can."""
    pool_nodes = [n for n in inventory if n.pool == request.pool]
    if not pool_nodes:
        pools = sorted({n.pool for n in inventory})
        return f"no pool named {request.pool!r}; pools: {', '.join(pools) or 'none'}"
    big = [
        n
        for n in pool_nodes
        if n.slots >= request.slots_per_node and n.num_gpus >= request.gpus_per_node
    ]
    if len(big) < request.nodes:
        most_slots = max(n.slots for n in pool_nodes)
        most_gpus = max(n.num_gpus for n in pool_nodes)
        return (
            f"the job needs {request.nodes} nodes with {request.slots_per_node} slots and "
            f"{request.gpus_per_node} GPUs each; pool {request.pool!r} has {len(big)} such nodes "
            f"({len(pool_nodes)} nodes, at most {most_slots} slots and {most_gpus} GPUs each): "
            "lower --nodes or --procs-per-node, or start the gateway with more nodes"
        )
    return None


def schedule_fifo(
    queue: Sequence[JobRequest],
    inventory: Sequence[NodeSpec],
    allocations: Iterable[Placement],
) -> list[Placement]:
    """Placements for the jobs that can start now, in queue order.

    Strict FIFO per pool: once the head of a pool's queue does not fit, no job
    behind it in that pool starts this cycle.

    Example:
        >>> inv = [NodeSpec("a", 1), NodeSpec("b", 1)]
        >>> q = [JobRequest("j1", 2, 1), JobRequest("j2", 2, 1)]
        >>> [p.job_id for p in schedule_fifo(q, inv, [])]
        ['j1']
    """
    free = free_capacity(inventory, allocations)
    blocked_pools: set[str] = set()
    placements: list[Placement] = []
    for request in queue:
        if request.pool in blocked_pools:
            continue
        placement = place(request, inventory, free)
        if placement is None:
            blocked_pools.add(request.pool)
            continue
        for a in placement.nodes:
            free[a.node].slots -= a.slots
            free[a.node].gpus = [g for g in free[a.node].gpus if g not in a.gpus]
        placements.append(placement)
    return placements
