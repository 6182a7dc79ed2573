"""Gang placement over an inventory of nodes, and the plain FIFO baseline.

A job asks for `nodes` distinct nodes, each with `slots_per_node` free rank slots
and `gpus_per_node` free GPUs. It gets all of them at once or none (gang). A gang
never mixes accelerator types: every node of one placement has the same
`accelerator`.

`schedule_fifo` is the plain baseline: strict FIFO per pool, the head of a pool's
queue that does not fit blocks the jobs behind it. The multi-tenant scheduler
(priorities, quotas, fair share, backfill, preemption) is `decide` in
`air_sdk.scheduler.decide`; the simulator measures one against the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from air_sdk.schema import NodeAssignment, Placement
from air_sdk.text import plural

#: Priority classes, lowest first; the index is the rank.
PRIORITIES = ("low", "normal", "high")
PRIORITY_RANK = {name: rank for rank, name in enumerate(PRIORITIES)}

#: `JobRequest.pool` value that lets the scheduler choose the pool.
ANY_POOL = "any"


@dataclass(frozen=True)
class NodeSpec:
    """One schedulable node: a real machine, or a "virtual node" on this machine.

    Example:
        >>> NodeSpec(name="node-0", slots=4, gpus=(0, 1)).num_gpus
        2
        >>> NodeSpec("g0", 8, tuple(range(8)), pool="a100", accelerator="a100").accelerator
        'a100'
    """

    name: str
    slots: int
    gpus: tuple[int, ...] = ()
    pool: str = "default"
    healthy: bool = True
    #: accelerator type, lower case ("a100", "h100", "cpu"); jobs may ask for one by name
    accelerator: str = "cpu"
    #: free-form labels such as {"region": "eu-west"}; the locality label keeps a gang together
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class JobRequest:
    """What the scheduler needs to know of a queued job.

    `pool` names a pool, or "any" to let the scheduler route the job; `accelerator`
    (e.g. "a100", or "gpu" for any GPU node) narrows the nodes it may use.
    `est_duration_s` (a time limit works: the job never runs longer) lets a small
    job be backfilled ahead of a blocked large one without delaying it.

    Example:
        >>> JobRequest("j", nodes=2, slots_per_node=8, gpus_per_node=8, tenant="t").num_gpus
        16
    """

    job_id: str
    nodes: int
    slots_per_node: int
    gpus_per_node: int = 0
    pool: str = "default"
    accelerator: str | None = None
    tenant: str = "default"
    priority: str = "normal"
    submitted_at: float = 0.0
    est_duration_s: float | None = None

    def __post_init__(self) -> None:
        if self.priority not in PRIORITY_RANK:
            raise ValueError(
                f"job {self.job_id}: priority {self.priority!r} is not one of {', '.join(PRIORITIES)}"
            )
        if self.nodes < 1 or self.slots_per_node < 1 or self.gpus_per_node < 0:
            raise ValueError(
                f"job {self.job_id}: nodes={self.nodes}, slots_per_node={self.slots_per_node},"
                f" gpus_per_node={self.gpus_per_node}: a job needs at least 1 node and 1 slot"
            )

    @cached_property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @cached_property
    def num_slots(self) -> int:
        return self.nodes * self.slots_per_node

    @cached_property
    def shape(self) -> tuple[int, int, int]:
        """(nodes, slots per node, GPUs per node)."""
        return (self.nodes, self.slots_per_node, self.gpus_per_node)

    @cached_property
    def route_key(self) -> str:
        """Jobs with equal keys may run in the same partitions. A string, not a tuple:
        a string keeps its hash, and a cycle looks the key up once per queued job."""
        return repr((self.pool, self.accelerator, *self.shape))


def node_matches(request: JobRequest, node: NodeSpec) -> bool:
    """True if `node` is in a pool and of an accelerator type the request accepts
    (capacity aside). "gpu" as an accelerator accepts any node with GPUs."""
    if request.pool != ANY_POOL and node.pool != request.pool:
        return False
    wanted = request.accelerator
    if wanted is None:
        return True
    wanted = wanted.lower()
    if wanted == "gpu":
        return node.num_gpus > 0
    return node.accelerator.lower() == wanted


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
    free for the next large job. With pool "any" the first pool (by name) where the
    whole gang fits is used; a gang never spans pools or accelerator types.

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
        and node_matches(request, n)
        and n.name in free
        and free[n.name].slots >= request.slots_per_node
        and len(free[n.name].gpus) >= request.gpus_per_node
    ]
    groups: dict[tuple[str, str], list[NodeSpec]] = {}
    for n in candidates:
        groups.setdefault((n.pool, n.accelerator), []).append(n)
    for (pool, _), nodes in sorted(groups.items()):
        if len(nodes) < request.nodes:
            continue
        nodes.sort(key=lambda n: (free[n.name].slots, len(free[n.name].gpus), n.name))
        chosen = sorted(nodes[: request.nodes], key=lambda n: n.name)
        return Placement(
            job_id=request.job_id,
            pool=pool,
            nodes=tuple(
                NodeAssignment(
                    node=n.name,
                    slots=request.slots_per_node,
                    gpus=tuple(free[n.name].gpus[: request.gpus_per_node]),
                )
                for n in chosen
            ),
        )
    return None


def fits_ever(request: JobRequest, inventory: Sequence[NodeSpec]) -> str | None:
    """None if an empty cluster could run the job, else the reason it never can, with
    the flag to change. On this machine's virtual nodes (`MACHINE_CORES_LABEL`) it
    names what the machine has and the `air gateway start` flag that resizes them.

    Example:
        >>> local = [NodeSpec(f"node-{i}", 1, labels={MACHINE_CORES_LABEL: "2"}) for i in range(2)]
        >>> print(fits_ever(JobRequest("j", 2, 4), local))
        the job needs 2 nodes with 4 slots each; the gateway's nodes have 1 slot each (this machine: 2 cores, no GPUs, split into 2 nodes): lower --procs-per-node to 1, or restart the gateway with --slots-per-node 4 (ranks beyond the cores share them)
    """
    pools = sorted({n.pool for n in inventory})
    if request.pool != ANY_POOL and request.pool not in pools:
        return f"no pool named {request.pool!r}; pools: {', '.join(pools) or 'none'}"
    matching = [n for n in inventory if node_matches(request, n)]
    if not matching:
        kinds = sorted({n.accelerator for n in inventory if request.pool in (ANY_POOL, n.pool)})
        where = "no pool has" if request.pool == ANY_POOL else f"pool {request.pool!r} has no"
        return (
            f"{where} {request.accelerator!r} nodes; accelerators here: "
            f"{', '.join(kinds) or 'none'}"
        )
    groups: dict[tuple[str, str], list[NodeSpec]] = {}
    for n in matching:
        groups.setdefault((n.pool, n.accelerator), []).append(n)
    best = 0
    for nodes in groups.values():
        big = [
            n
            for n in nodes
            if n.slots >= request.slots_per_node and n.num_gpus >= request.gpus_per_node
        ]
        if len(big) >= request.nodes:
            return None
        best = max(best, len(big))
    if all(MACHINE_CORES_LABEL in n.labels for n in inventory):
        return _never_fits_here(request, list(inventory))
    where = "any pool" if request.pool == ANY_POOL else f"pool {request.pool!r}"
    most_slots = max(n.slots for n in matching)
    most_gpus = max(n.num_gpus for n in matching)
    return (
        f"the job needs {_per_node(request)}; {where} has {plural(best, 'such node')}"
        f" ({plural(len(matching), 'node')}, at most {plural(most_slots, 'slot')} and"
        f" {plural(most_gpus, 'GPU')} each): lower --nodes, --procs-per-node or"
        " --gpus-per-node, or add such nodes to the cluster"
    )


#: set by the local backend on this machine's virtual nodes: the machine's cores and
#: GPUs, so a job that can never fit is told which `air gateway start` flag resizes them
MACHINE_CORES_LABEL = "air.machine/cores"
MACHINE_GPUS_LABEL = "air.machine/gpus"


def _per_node(request: JobRequest) -> str:
    need = f"{plural(request.nodes, 'node')} with {plural(request.slots_per_node, 'slot')}"
    if request.gpus_per_node:
        need += f" and {plural(request.gpus_per_node, 'GPU')}"
    return need + " each"


def _never_fits_here(request: JobRequest, nodes: list[NodeSpec]) -> str:
    """Why a job never fits this machine's virtual nodes, and the flag that would help."""
    cores = int(nodes[0].labels.get(MACHINE_CORES_LABEL, "0") or 0)
    gpus = int(nodes[0].labels.get(MACHINE_GPUS_LABEL, "0") or 0)
    machine = (
        f"this machine: {plural(cores, 'core')}, "
        f"{plural(gpus, 'GPU') if gpus else 'no GPUs'}, split into {plural(len(nodes), 'node')}"
    )
    need = f"the job needs {_per_node(request)}"
    if request.gpus_per_node:
        if not gpus:
            return f"{need}; this machine has no GPUs ({machine}): give --gpus-per-node 0 (CPU)"
        if request.nodes * request.gpus_per_node > gpus:
            return (
                f"{need}, {plural(request.nodes * request.gpus_per_node, 'GPU')} in all;"
                f" {machine}: lower --nodes or --gpus-per-node"
            )
        return (
            f"{need}; the gateway's nodes have {plural(min(n.num_gpus for n in nodes), 'GPU')}"
            f" each ({machine}): restart the gateway with --nodes {request.nodes}, so each"
            f" node gets {plural(gpus // request.nodes, 'GPU')}, or lower --gpus-per-node"
        )
    slots = min(n.slots for n in nodes)
    if len(nodes) < request.nodes:
        widest = f"{plural(len(nodes), 'node')} x {plural(slots, 'rank')}"
        if request.nodes > cores:
            # one virtual node per core at most: never "restart with --nodes 1000"
            return (
                f"{need}; this gateway places at most {widest} ({machine}): lower --nodes"
                f" to {len(nodes)}; for more nodes, submit to a cluster that has them (air"
                " gateway start --cluster FILE with a larger pool, or --backend ray)"
            )
        per_node = max(1, cores // request.nodes)
        flags = f"--nodes {request.nodes}"
        if per_node < request.slots_per_node:
            flags += f" --slots-per-node {request.slots_per_node}"
        return (
            f"{need}; this gateway places at most {widest} ({machine}): lower --nodes"
            f" to {len(nodes)}, or restart the gateway with {flags}"
        )
    return (
        f"{need}; the gateway's nodes have {plural(slots, 'slot')} each ({machine}): lower"
        f" --procs-per-node to {slots}, or restart the gateway with --slots-per-node"
        f" {request.slots_per_node} (ranks beyond the cores share them)"
    )


def schedule_fifo(
    queue: Sequence[JobRequest],
    inventory: Sequence[NodeSpec],
    allocations: Iterable[Placement],
) -> list[Placement]:
    """Placements for the jobs that can start now, in queue order.

    Strict FIFO per pool: once the head of a pool's queue does not fit, no job
    behind it in that pool starts this cycle. No priorities, quotas or backfill:
    this is the baseline the multi-tenant `decide` is measured against.

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
