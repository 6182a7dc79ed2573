"""Which running jobs to preempt so that a blocked higher-priority gang fits.

Rules, in order: only strictly lower-priority, preemptible jobs are victims; the
lowest priority class is used up first (normal-priority jobs are touched only if
low-priority ones cannot make room); within that, the fewest victims; among equals,
the youngest (least work lost since they started). Jobs already being stopped count
as free capacity, so a cycle never preempts twice for the same room.

Finding the true minimum is a set-cover problem. One greedy pass prices each node's
cheapest clearing set (per node it frees: a victim holding several nodes of the gang
frees them all), takes the cheapest sets until enough nodes are free, then drops any
victim the gang does not need (most valuable first). It is exact for one-node jobs
and when victims are whole nodes, and costs O(nodes x jobs per node).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from air_sdk.scheduler.capacity import Alloc, Capacity, Partition
from air_sdk.scheduler.gang import JobRequest


@dataclass(frozen=True, slots=True)
class VictimCandidate:
    """A running job that could be preempted."""

    job_id: str
    rank: int
    started_at: float
    allocs: tuple[Alloc, ...]


@dataclass
class PreemptionPlan:
    """The victims (none when jobs already stopping free enough), the nodes the gang
    takes once they exit, and what those nodes have to spare then."""

    victims: list[VictimCandidate]
    nodes: list[int]
    spare: dict[int, list[int]]
    now: float

    def cost(self) -> tuple[int, int, float]:
        """Lower is better: highest victim priority, number of victims, work lost."""
        if not self.victims:
            return (-1, 0, 0.0)
        return (
            max(v.rank for v in self.victims),
            len(self.victims),
            sum(self.now - v.started_at for v in self.victims),
        )


Table = dict[int, list[int]]
#: a victim with the slots and GPUs it holds on one node
OnNode = tuple[VictimCandidate, int, int]
#: a node's clearing set, priced: (victims, their highest rank, how many, the sum of
#: their start times, whether one of them holds other nodes too)
Clearing = tuple[tuple[VictimCandidate, ...], int, int, float, bool]
#: clearing(node, max_rank, free slots, free GPUs, slots, GPUs) -> the node's Clearing
#: for a rank that needs (slots, GPUs), or None; see `clearing_set`
ClearingOf = Callable[[int, int, int, int, int, int], "Clearing | None"]


def victim_order(v: VictimCandidate) -> tuple[int, float, str]:
    """Who goes first: lowest priority, then youngest."""
    return (v.rank, -v.started_at, v.job_id)


def choose_victims(
    cap: Capacity,
    part: Partition,
    job: JobRequest,
    terminating: Sequence[Sequence[Alloc]],
    clearing: ClearingOf,
    job_rank: int,
    now: float,
) -> PreemptionPlan | None:
    """The preemption plan for `job` in `part`, or None if no set of strictly
    lower-priority jobs makes it fit. `clearing` gives a node's clearing set: the
    `clearing_set` of the preemptible jobs holding a part of it, in `victim_order`
    (`ClusterBook.clearing_set` remembers them between cycles)."""
    n, s, g = job.nodes, job.slots_per_node, job.gpus_per_node
    eligible = part.big_enough(s, g)
    if len(eligible) < n:
        return None
    # tables hold only the nodes whose free capacity differs from `cap`'s: a search
    # touches a few nodes of a partition, and a row per node cost more than the search
    base: Table = {}
    for allocs in terminating:
        for i, rs, rg in allocs:
            f = _free(cap, base, i)
            f[0] += rs
            f[1] += rg
    ready = _ready(eligible, base, cap, s, g)
    if len(ready) >= n:
        return _plan([], ready, base, cap, n, s, g, now)
    eligible_set = set(eligible)
    for max_rank in range(job_rank):
        chosen = _greedy(clearing, max_rank, eligible_set, ready, base, cap, n, s, g, now)
        if chosen is None:
            continue
        chosen = _prune(chosen, eligible_set, base, cap, n, s, g)
        table = _apply(chosen, base, cap)
        return _plan(chosen, _ready(eligible, table, cap, s, g), table, cap, n, s, g, now)
    return None


def _free(cap: Capacity, table: Table, i: int) -> list[int]:
    """Node `i`'s row of `table`, added (from `cap`) if missing, to change."""
    f = table.get(i)
    if f is None:
        f = table[i] = [cap.free_slots[i], cap.free_gpus(i)]
    return f


def _ready(
    eligible: Sequence[int] | set[int], table: Table, cap: Capacity, s: int, g: int
) -> set[int]:
    """The eligible nodes with room for one rank of the gang."""
    free_slots, free_mask = cap.free_slots, cap.free_mask
    ready = {i for i in eligible if free_slots[i] >= s and free_mask[i].bit_count() >= g}
    if table:  # rows of `table` replace `cap`'s
        for i, (fs, fg) in table.items():
            if fs >= s and fg >= g:
                ready.add(i)
            else:
                ready.discard(i)
        ready.intersection_update(eligible)
    return ready


def _ok(f: list[int], s: int, g: int) -> bool:
    return f[0] >= s and f[1] >= g


def _apply(victims: Sequence[VictimCandidate], base: Table, cap: Capacity) -> Table:
    table = {i: list(f) for i, f in base.items()}
    for v in victims:
        for i, rs, rg in v.allocs:
            f = _free(cap, table, i)
            f[0] += rs
            f[1] += rg
    return table


def clearing_set(
    entries: Sequence[OnNode], max_rank: int, fs: int, fg: int, s: int, g: int
) -> Clearing | None:
    """The victims (of rank at most `max_rank`) that free a node with `fs` slots and
    `fg` GPUs free for a rank of (`s`, `g`), from `entries`, the jobs on the node in
    victim order: in that order until it fits, then without those it does not need
    (the most valuable, oldest, dropped first). None if they cannot.

    Example:
        >>> a = VictimCandidate("a", 0, 5.0, ((0, 4, 4),))
        >>> b = VictimCandidate("b", 0, 1.0, ((0, 4, 4), (1, 8, 8)))
        >>> clearing_set([(a, 4, 4), (b, 4, 4)], 0, 0, 0, 4, 4)
        ((VictimCandidate(job_id='a', rank=0, started_at=5.0, allocs=((0, 4, 4),)),), 0, 1, 5.0, False)
    """
    victims = _clearing_victims(entries, max_rank, fs, fg, s, g)
    if victims is None:
        return None
    return (
        victims,
        max(v.rank for v in victims),
        len(victims),
        sum(v.started_at for v in victims),
        any(len(v.allocs) > 1 for v in victims),
    )


def _clearing_victims(
    entries: Sequence[OnNode], max_rank: int, fs: int, fg: int, s: int, g: int
) -> tuple[VictimCandidate, ...] | None:
    taken: list[OnNode] = []
    for entry in entries:
        if entry[0].rank > max_rank:
            break  # in victim order: the rest rank higher
        taken.append(entry)
        fs += entry[1]
        fg += entry[2]
        if fs >= s and fg >= g:
            break
    if not (fs >= s and fg >= g):
        return None
    if len(taken) > 1:
        for entry in sorted(taken, key=lambda e: (-e[0].rank, e[0].started_at, e[0].job_id)):
            if fs - entry[1] >= s and fg - entry[2] >= g:
                taken.remove(entry)
                fs -= entry[1]
                fg -= entry[2]
    return tuple(e[0] for e in taken)


def _greedy(
    clearing: ClearingOf,
    max_rank: int,
    eligible: set[int],
    ready0: set[int],
    base: Table,
    cap: Capacity,
    n: int,
    s: int,
    g: int,
    now: float,
) -> list[VictimCandidate] | None:
    """One pass: price every node's clearing set (per node it clears, a victim holding
    several nodes of the gang clears them all), take the cheapest until enough nodes
    are free."""
    priced: list[tuple[tuple[int, float, float, int], tuple[VictimCandidate, ...]]] = []
    free_slots, free_mask = cap.free_slots, cap.free_mask
    for i in eligible:
        if i in ready0:
            continue
        f = base.get(i)
        if f is None:
            c = clearing(i, max_rank, free_slots[i], free_mask[i].bit_count(), s, g)
        else:
            c = clearing(i, max_rank, f[0], f[1], s, g)
        if c is None:
            continue
        victims, top, k, started, spans = c
        gain = 1  # the node itself; a victim on several nodes may clear more of the gang
        if n > 1 and spans:
            gain = max(1, _gain(victims, ready0, eligible, base, cap, s, g))
        # the work lost, sum(now - start), is k * now - sum(start)
        priced.append(((top, k / gain, k * now - started, i), victims))
    if len(priced) + len(ready0) < n:
        return None
    priced.sort(key=lambda e: e[0])
    table = {i: list(f) for i, f in base.items()}
    ready = set(ready0)
    chosen: list[VictimCandidate] = []
    taken: set[str] = set()
    for _, victims in priced:
        for v in victims:
            if v.job_id in taken:
                continue
            taken.add(v.job_id)
            chosen.append(v)
            for j, rs, rg in v.allocs:
                f = _free(cap, table, j)
                f[0] += rs
                f[1] += rg
                if j in eligible and _ok(f, s, g):
                    ready.add(j)
        if len(ready) >= n:
            return chosen
    return None


def _gain(
    added: Sequence[VictimCandidate],
    ready: set[int],
    eligible: set[int],
    table: Table,
    cap: Capacity,
    s: int,
    g: int,
) -> int:
    """How many more nodes of the gang these victims would clear."""
    delta: dict[int, list[int]] = {}
    for v in added:
        for j, rs, rg in v.allocs:
            if j in eligible and j not in ready:
                d = delta.setdefault(j, [0, 0])
                d[0] += rs
                d[1] += rg
    count = 0
    for j, (ds, dg) in delta.items():
        f = table.get(j)
        fs, fg = (f[0], f[1]) if f is not None else (cap.free_slots[j], cap.free_gpus(j))
        if fs + ds >= s and fg + dg >= g:
            count += 1
    return count


def _prune(
    chosen: list[VictimCandidate],
    eligible: set[int],
    base: Table,
    cap: Capacity,
    n: int,
    s: int,
    g: int,
) -> list[VictimCandidate]:
    """Drop every victim the gang does not need, the most valuable (oldest) first.

    Counts by difference: what the kept victims free is kept per node, so a trial
    looks only at the nodes of the victim it would spare."""
    freed: Table = {}  # eligible node a victim touches -> its free room once they exit
    for v in chosen:
        for j, rs, rg in v.allocs:
            if j in eligible:
                f = freed.get(j)
                if f is None:
                    f = freed[j] = list(base.get(j) or (cap.free_slots[j], cap.free_gpus(j)))
                f[0] += rs
                f[1] += rg
    ready = len(_ready(eligible, base, cap, s, g).difference(freed))
    ready += sum(1 for f in freed.values() if _ok(f, s, g))
    spared: set[str] = set()
    for v in sorted(chosen, key=lambda v: (-v.rank, v.started_at, v.job_id)):
        without: Table = {}
        for j, rs, rg in v.allocs:
            if j in freed:
                f = without.get(j)
                if f is None:
                    f = without[j] = list(freed[j])
                f[0] -= rs
                f[1] -= rg
        lost = sum(1 for j, f in without.items() if _ok(freed[j], s, g) and not _ok(f, s, g))
        if ready - lost >= n:
            spared.add(v.job_id)
            freed.update(without)
            ready -= lost
    return [v for v in chosen if v.job_id not in spared]


def _plan(
    victims: list[VictimCandidate],
    ready: set[int],
    table: Table,
    cap: Capacity,
    n: int,
    s: int,
    g: int,
    now: float,
) -> PreemptionPlan:
    def f(i: int) -> list[int]:
        return table.get(i) or [cap.free_slots[i], cap.free_gpus(i)]

    # the nodes busiest now first: nodes free now stay open to other jobs meanwhile
    nodes = sorted(
        ready, key=lambda i: (cap.free_gpus(i), cap.free_slots[i], f(i)[1], cap.names[i])
    )[:n]
    return PreemptionPlan(
        victims=victims,
        nodes=nodes,
        spare={i: [f(i)[0] - s, f(i)[1] - g] for i in nodes},
        now=now,
    )
