"""Virtual nodes of one machine share its cores: at most one rank per core across them.

By default each CPU virtual node of the local backend offers every core of the machine
(so a 1-node x 2-rank job fits a 2-core laptop), and the node's
`MACHINE_MAX_RANKS_LABEL` caps the ranks that all of them run at once (so two such
jobs, or a 2-node x 2-rank one, do not put 4 ranks on 2 cores). Oversubscribing (more
ranks than cores) is explicit: `air gateway start --oversubscribe`, or a
`--slots-per-node` whose total is above the cores; the gateway warns at start and each
job placed beyond the cores gets an `oversubscribed` alert.

The scheduler places on slots; the runner holds back a placement that would go over
the cap (the job stays queued, and says why). A job that could never fit under it is
refused at submit by `never_fits` (the same check, and the same sentence, for a 2 x 2
and a 1 x 4 job: the same ranks on the same cores), and failed with that sentence if it
was queued before the gateway shrank.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from air_sdk.scheduler import JobRequest, NodeSpec, fits_ever
from air_sdk.schema import Placement
from air_sdk.text import plural

__all__ = [
    "MACHINE_MAX_RANKS_LABEL",
    "MachineCap",
    "never_fits",
    "oversubscribed_by",
    "oversubscription",
]

#: on a CPU virtual node: how many ranks this machine's virtual nodes run at once
MACHINE_MAX_RANKS_LABEL = "air.machine/max-ranks"


@dataclass(frozen=True)
class MachineCap:
    """The ranks this machine's capped virtual nodes may run at once.

    Example:
        >>> from air_sdk.schema import NodeAssignment
        >>> nodes = [NodeSpec(f"node-{i}", 2, labels={MACHINE_MAX_RANKS_LABEL: "2"}) for i in (0, 1)]
        >>> cap = MachineCap.of(nodes)
        >>> one = Placement(job_id="a", nodes=(NodeAssignment(node="node-0", slots=2),))
        >>> two = Placement(job_id="b", nodes=(NodeAssignment(node="node-1", slots=1),))
        >>> [p.job_id for p in cap.admit([one, two], running=[])[0]]
        ['a']
    """

    max_ranks: int
    nodes: frozenset[str]
    #: rank slots of each capped node (the most one node may run)
    slots_per_node: int = 0

    @classmethod
    def of(cls, inventory: Sequence[NodeSpec]) -> MachineCap | None:
        """The cap the inventory's nodes carry; None when none does (GPU nodes, Ray,
        an oversubscribed gateway)."""
        capped = [n for n in inventory if MACHINE_MAX_RANKS_LABEL in n.labels]
        if not capped:
            return None
        return cls(
            int(capped[0].labels[MACHINE_MAX_RANKS_LABEL]),
            frozenset(n.name for n in capped),
            min(n.slots for n in capped),
        )

    def ranks(self, placement: Placement) -> int:
        """The ranks `placement` puts on this machine."""
        return sum(a.slots for a in placement.nodes if a.node in self.nodes)

    def largest(self) -> str:
        """The widest jobs this machine places, as nodes x ranks per node.

        Example:
            >>> MachineCap(2, frozenset({"node-0", "node-1"}), 2).largest()
            '1 node x 2 ranks or 2 nodes x 1 rank'
        """
        per_node = self.slots_per_node or self.max_ranks
        shapes = [
            (n, min(per_node, self.max_ranks // n))
            for n in range(1, len(self.nodes) + 1)
            if self.max_ranks // n >= 1
        ]
        most = max(n * p for n, p in shapes)
        widest = [(n, p) for n, p in shapes if n * p == most]
        return " or ".join(f"{plural(n, 'node')} x {plural(p, 'rank')}" for n, p in widest)

    def never(self, request: JobRequest) -> str | None:
        """Why the job could never run under the cap (what fits, and how to get more),
        else None. It depends only on the job's total ranks, so a 2 x 2 and a 1 x 4 job
        are told the same.

        Example:
            >>> cap = MachineCap(2, frozenset({"node-0", "node-1"}), 2)
            >>> print(cap.never(JobRequest("j", 2, 2)))
            the job runs 4 ranks at once; this gateway runs at most 2 ranks at once (1 node x 2 ranks or 2 nodes x 1 rank: this machine's 2 cores, shared by its 2 virtual nodes): lower --nodes or --procs-per-node; for more ranks, restart the gateway with --oversubscribe (ranks beyond the cores share them), or submit to a cluster with more cores (air gateway start --cluster FILE or --backend ray)
            >>> cap.never(JobRequest("j", 1, 4)) == cap.never(JobRequest("j", 2, 2))
            True
        """
        if request.gpus_per_node:
            return None
        total = request.nodes * request.slots_per_node
        if total <= self.max_ranks:
            return None
        return (
            f"the job runs {plural(total, 'rank')} at once; this gateway runs at most"
            f" {plural(self.max_ranks, 'rank')} at once ({self.largest()}: this machine's"
            f" {plural(self.max_ranks, 'core')}, shared by its"
            f" {plural(len(self.nodes), 'virtual node')}): lower --nodes or --procs-per-node;"
            " for more ranks, restart the gateway with --oversubscribe (ranks beyond the"
            " cores share them), or submit to a cluster with more cores (air gateway start"
            " --cluster FILE or --backend ray)"
        )

    def admit(
        self, placements: Iterable[Placement], running: Iterable[Placement]
    ) -> tuple[list[Placement], list[Placement]]:
        """(the placements that fit under the cap beside the running ones, in order; those
        held back for now)."""
        used = sum(self.ranks(p) for p in running)
        admitted, held = [], []
        for p in placements:
            n = self.ranks(p)
            if n and used + n > self.max_ranks:
                held.append(p)
                continue
            used += n
            admitted.append(p)
        return admitted, held

    def waiting_reason(self, running: Iterable[Placement]) -> str:
        used = sum(self.ranks(p) for p in running)
        return (
            f"waiting: this machine's {plural(self.max_ranks, 'core')} run"
            f" {plural(used, 'rank')} of other jobs (one rank per core; restart the gateway"
            " with --oversubscribe to share cores)"
        )


def never_fits(request: JobRequest, inventory: Sequence[NodeSpec]) -> str | None:
    """Why a job can never run on `inventory`, with what to change, else None: the
    machine's core cap first (a matter of total ranks), then the nodes' shapes
    (`scheduler.fits_ever`). The gateway asks it at submit and the runner again before
    it places a queued job, so both say the same.

    Example:
        >>> nodes = [NodeSpec(f"node-{i}", 2, labels={MACHINE_MAX_RANKS_LABEL: "2"}) for i in (0, 1)]
        >>> never_fits(JobRequest("j", 2, 1), nodes) is None
        True
        >>> never_fits(JobRequest("j", 1, 4), nodes) == never_fits(JobRequest("j", 2, 2), nodes)
        True
    """
    cap = MachineCap.of(inventory)
    why = cap.never(request) if cap is not None else None
    return why if why is not None else fits_ever(request, inventory)


def oversubscription(nodes: Sequence[NodeSpec], cores: int) -> str | None:
    """A warning when this machine's CPU virtual nodes offer more rank slots than it has
    cores and nothing caps them, else None.

    Example:
        >>> nodes = [NodeSpec(f"node-{i}", 2) for i in (0, 1)]
        >>> print(oversubscription(nodes, cores=2))
        oversubscribed: 2 virtual nodes x 2 slots = 4 ranks on 2 cores; ranks beyond the cores share them (slower, and timing-sensitive code may time out)
    """
    cpu = [n for n in nodes if not n.gpus]
    if not cpu or any(MACHINE_MAX_RANKS_LABEL in n.labels for n in cpu):
        return None
    total = sum(n.slots for n in cpu)
    if total <= cores:
        return None
    slots = {n.slots for n in cpu}
    shape = (
        f"{plural(len(cpu), 'virtual node')} x {plural(cpu[0].slots, 'slot')}"
        if len(slots) == 1
        else plural(len(cpu), "virtual node")
    )
    return (
        f"oversubscribed: {shape} = {plural(total, 'rank')} on {plural(cores, 'core')}; ranks beyond"
        " the cores share them (slower, and timing-sensitive code may time out)"
    )


def oversubscribed_by(
    placement: Placement, running: Iterable[Placement], inventory: Sequence[NodeSpec]
) -> str | None:
    """What to tell a job placed on this machine's uncapped CPU virtual nodes when its
    ranks and the running jobs' ranks are more than the machine's cores, else None.

    Example:
        >>> from air_sdk.scheduler import MACHINE_CORES_LABEL
        >>> from air_sdk.schema import NodeAssignment
        >>> nodes = [NodeSpec(f"node-{i}", 2, labels={MACHINE_CORES_LABEL: "2"}) for i in (0, 1)]
        >>> p = Placement(job_id="a", nodes=tuple(NodeAssignment(node=n.name, slots=2) for n in nodes))
        >>> print(oversubscribed_by(p, [], nodes))
        4 ranks (this job's 4, other jobs' 0) on 2 cores: ranks beyond the cores share them; the gateway runs oversubscribed (--oversubscribe or --slots-per-node)
    """
    from air_sdk.scheduler import MACHINE_CORES_LABEL

    shared = {
        n.name: int(n.labels[MACHINE_CORES_LABEL])
        for n in inventory
        if MACHINE_CORES_LABEL in n.labels
        and MACHINE_MAX_RANKS_LABEL not in n.labels
        and not n.gpus
    }
    if not shared:
        return None
    cores = next(iter(shared.values()))

    def on_machine(p: Placement) -> int:
        return sum(a.slots for a in p.nodes if a.node in shared)

    mine = on_machine(placement)
    others = sum(on_machine(p) for p in running if p.job_id != placement.job_id)
    if not mine or mine + others <= cores:
        return None
    return (
        f"{plural(mine + others, 'rank')} (this job's {mine}, other jobs' {others}) on"
        f" {plural(cores, 'core')}: ranks beyond the cores share them; the gateway runs"
        " oversubscribed (--oversubscribe or --slots-per-node)"
    )
