"""Free capacity, indexed so that a scheduling cycle never rescans every node for
every queued job.

Nodes are grouped into partitions (pool x accelerator: a gang never mixes them).
Inside a partition, nodes sit in buckets keyed by (free GPUs, free slots); a best-fit
search walks the sorted keys from the smallest that can hold the request. GPUs are
bit masks. Within one cycle capacity only shrinks (a cycle only adds placements), so
a request shape that failed once fails for every larger shape too: a `Partition`
remembers the smallest failures and answers them without a search.

A `Capacity` is kept up to date between cycles (`take`/`give_back` as jobs start
and end) and `copy()`-ed for each cycle, which costs O(nodes), not O(running jobs).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

from air_sdk.scheduler.gang import NodeSpec
from air_sdk.schema import Placement

#: a request shape: (nodes, slots per node, GPUs per node)
Shape = tuple[int, int, int]
#: what one job holds on one node: (node index, slots, GPUs)
Alloc = tuple[int, int, int]


def _dominated(failed: list[Shape], shape: Shape) -> bool:
    n, s, g = shape
    for fn, fs, fg in failed:  # noqa: SIM110 (a plain loop: this runs per queued job)
        if fn <= n and fs <= s and fg <= g:
            return True
    return False


def _remember(failed: list[Shape], shape: Shape) -> None:
    n, s, g = shape
    failed[:] = [f for f in failed if not (n <= f[0] and s <= f[1] and g <= f[2])]
    failed.append(shape)


class Partition:
    """The healthy nodes of one pool with one accelerator type, and their free capacity."""

    def __init__(self, pool: str, accelerator: str, label: str, index: int) -> None:
        self.pool = pool
        self.accelerator = accelerator
        #: name used in explanations and reservation keys: the pool, or pool/accelerator
        self.label = label
        self.index = index
        self.nodes: list[int] = []
        self.total_gpus = 0
        self.total_slots = 0
        self.has_gpus = False
        #: (slots, GPUs) each node has in all; shared by copies
        self.caps: list[tuple[int, int]] = []
        #: (slots, GPUs) -> the nodes that big when empty; shared by copies
        self._big: dict[tuple[int, int], list[int]] = {}
        #: (free GPUs, free slots) -> node indexes, ascending (inventory order breaks ties)
        self._buckets: dict[tuple[int, int], list[int]] = {}
        self._keys: list[tuple[int, int]] = []
        #: shapes that did not fit this cycle, alone / beside a reservation (the smallest
        #: ones: any larger shape fails too, since capacity only shrinks within a cycle)
        self.failed_plain: list[Shape] = []
        self.failed_capped: list[Shape] = []

    def clone(self) -> Partition:
        """A copy whose free capacity can change without touching this one."""
        c = Partition.__new__(Partition)
        c.__dict__.update(self.__dict__)
        c._buckets = {k: v.copy() for k, v in self._buckets.items()}
        c._keys = self._keys.copy()
        c.failed_plain = []
        c.failed_capped = []
        return c

    def _add(self, node: int, key: tuple[int, int]) -> None:
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [node]
            insort(self._keys, key)
        elif node > bucket[-1]:
            bucket.append(node)
        else:
            insort(bucket, node)

    def _remove(self, node: int, key: tuple[int, int]) -> None:
        bucket = self._buckets[key]
        del bucket[bisect_left(bucket, node)]
        if not bucket:
            del self._buckets[key]
            del self._keys[bisect_left(self._keys, key)]

    def can_ever(self, nodes: int, slots: int, gpus: int) -> bool:
        """Could the empty partition hold this gang?"""
        return self.capable(slots, gpus) >= nodes

    def capable(self, slots: int, gpus: int) -> int:
        """Nodes big enough for (slots, gpus) when empty."""
        return len(self.big_enough(slots, gpus))

    def big_enough(self, slots: int, gpus: int) -> list[int]:
        """The nodes big enough for (slots, gpus) when empty, in inventory order (do not
        change the list: it is kept for the next caller)."""
        found = self._big.get((slots, gpus))
        if found is None:
            found = [
                i
                for i, (cs, cg) in zip(self.nodes, self.caps, strict=True)
                if cs >= slots and cg >= gpus
            ]
            self._big[(slots, gpus)] = found
        return found

    def count_free(self, slots: int, gpus: int) -> int:
        """Nodes with at least `slots` free slots and `gpus` free GPUs now."""
        total = 0
        for key in self._keys[bisect_left(self._keys, (gpus, slots)) :]:
            if key[1] >= slots:
                total += len(self._buckets[key])
        return total


class Capacity:
    """Free slots and GPUs of every healthy node, with partitions.

    Example:
        >>> cap = Capacity([NodeSpec("a", 2, (0, 1)), NodeSpec("b", 2, (0, 1))])
        >>> cap.find(cap.partitions[0], 2, 1, 1)
        [0, 1]
    """

    def __init__(self, inventory: Sequence[NodeSpec], held: Iterable[Placement] = ()) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.free_slots: list[int] = []
        self.free_mask: list[int] = []
        self.gpu_ids: list[tuple[int, ...]] = []
        #: GPU ids are 0..n-1, so an id is its own bit
        self.plain_ids: list[bool] = []
        self.cap_slots: list[int] = []
        self.cap_gpus: list[int] = []
        self.labels: list[dict[str, str]] = []
        self.part_index: list[int] = []
        self.partitions: list[Partition] = []
        self.by_key: dict[tuple[str, str], Partition] = {}
        self._locality: dict[str | None, tuple[list[str | None], dict[int, bool]]] = {}
        pools_accels: dict[str, set[str]] = {}
        healthy = [n for n in inventory if n.healthy]
        for n in healthy:
            pools_accels.setdefault(n.pool, set()).add(n.accelerator)
        for n in healthy:
            if n.name in self.index:
                raise ValueError(f"node {n.name!r} appears twice in the inventory")
            key = (n.pool, n.accelerator)
            part = self.by_key.get(key)
            if part is None:
                label = n.pool if len(pools_accels[n.pool]) == 1 else f"{n.pool}/{n.accelerator}"
                part = self.by_key[key] = Partition(
                    n.pool, n.accelerator, label, len(self.partitions)
                )
                self.partitions.append(part)
            i = len(self.names)
            self.names.append(n.name)
            self.index[n.name] = i
            self.free_slots.append(n.slots)
            self.free_mask.append((1 << len(n.gpus)) - 1)
            self.gpu_ids.append(n.gpus)
            self.plain_ids.append(n.gpus == tuple(range(len(n.gpus))))
            self.cap_slots.append(n.slots)
            self.cap_gpus.append(len(n.gpus))
            self.labels.append(dict(n.labels))
            self.part_index.append(part.index)
            part.nodes.append(i)
            part.total_gpus += len(n.gpus)
            part.total_slots += n.slots
            part.has_gpus = part.has_gpus or bool(n.gpus)
            part.caps.append((n.slots, len(n.gpus)))
        for placement in held:
            for a in placement.nodes:
                k = self.index.get(a.node)
                if k is not None:
                    self.free_slots[k] -= a.slots
                    if a.gpus:
                        self.free_mask[k] &= ~self.mask_of(k, a.gpus)
        for part in self.partitions:
            for i in part.nodes:
                part._add(i, (self.free_mask[i].bit_count(), self.free_slots[i]))

    def copy(self) -> Capacity:
        """A copy for one cycle: free capacity and indexes copied, the rest shared."""
        c = Capacity.__new__(Capacity)
        c.__dict__.update(self.__dict__)
        c.free_slots = self.free_slots.copy()
        c.free_mask = self.free_mask.copy()
        c.partitions = [p.clone() for p in self.partitions]
        c.by_key = {(p.pool, p.accelerator): p for p in c.partitions}
        return c

    # -- bookkeeping ----------------------------------------------------------------------

    def mask_of(self, node: int, gpus: Iterable[int]) -> int:
        ids = self.gpu_ids[node]
        mask = 0
        if self.plain_ids[node]:
            n = len(ids)
            for g in gpus:
                if 0 <= g < n:
                    mask |= 1 << g
            return mask
        for g in gpus:
            if g in ids:
                mask |= 1 << ids.index(g)
        return mask

    def allocs_of(self, placement: Placement) -> list[Alloc]:
        """(node index, slots, GPUs) per assignment on a known healthy node."""
        out = []
        for a in placement.nodes:
            i = self.index.get(a.node)
            if i is not None:
                out.append((i, a.slots, len(a.gpus)))
        return out

    def take(self, placement: Placement) -> None:
        """Mark a placement's slots and GPUs as held (a job started)."""
        self._change(placement, -1)

    def give_back(self, placement: Placement) -> None:
        """Free a placement's slots and GPUs again (a job ended)."""
        self._change(placement, +1)

    def _change(self, placement: Placement, sign: int) -> None:
        for a in placement.nodes:
            i = self.index.get(a.node)
            if i is None:
                continue  # node gone or unhealthy: nothing to give back
            part = self.partitions[self.part_index[i]]
            mask = self.free_mask[i]
            part._remove(i, (mask.bit_count(), self.free_slots[i]))
            if a.gpus:
                bits = self.mask_of(i, a.gpus)
                mask = mask | bits if sign > 0 else mask & ~bits
            self.free_mask[i] = mask
            self.free_slots[i] += sign * a.slots
            part._add(i, (mask.bit_count(), self.free_slots[i]))

    def free_gpus(self, node: int) -> int:
        return self.free_mask[node].bit_count()

    def locality(self, label: str | None) -> tuple[list[str | None], dict[int, bool]]:
        """Each node's value of `label`, and per partition whether values differ."""
        found = self._locality.get(label)
        if found is None:
            values = [d.get(label) if label else None for d in self.labels]
            varied = {}
            for p in self.partitions:
                seen = {values[i] for i in p.nodes}
                varied[p.index] = len(seen) > 1 or seen != {None}
            found = self._locality[label] = (values, varied)
        return found

    # -- search -----------------------------------------------------------------------------

    def find(
        self,
        part: Partition,
        nodes: int,
        slots: int,
        gpus: int,
        *,
        cap: dict[int, list[int]] | None = None,
        locality_label: str | None = None,
        strict_locality: bool = False,
    ) -> list[int] | None:
        """`nodes` distinct nodes of `part` that can each take `slots` and `gpus` now, the
        fullest first (best fit); None if there are not enough. `cap` limits some nodes
        further ({node: [slots, gpus]}: what a reservation leaves them). A multi-node gang
        keeps to one value of the locality label when it can."""
        shape = (nodes, slots, gpus)
        failed = part.failed_plain if cap is None else part.failed_capped
        if failed and _dominated(failed, shape):
            return None
        grouped = False
        values: list[str | None] = []
        if nodes > 1 and locality_label:
            values, varied = self.locality(locality_label)
            grouped = varied[part.index]
        chosen: list[int] = []
        groups: dict[str | None, list[int]] = {}
        keys = part._keys
        buckets = part._buckets
        for key in keys[bisect_left(keys, (gpus, slots)) :]:
            if key[1] < slots:
                continue
            for i in buckets[key]:
                if cap is not None:
                    limit = cap.get(i)
                    if limit is not None and (limit[0] < slots or limit[1] < gpus):
                        continue
                if grouped:
                    group = groups.setdefault(values[i], [])
                    group.append(i)
                    if len(group) == nodes:
                        return group
                chosen.append(i)
                if not grouped and len(chosen) == nodes:
                    return chosen
        if grouped and len(chosen) >= nodes and not strict_locality:
            return chosen[:nodes]
        _remember(failed, shape)
        return None

    def allocate(self, node: int, slots: int, gpus: int) -> tuple[int, ...]:
        """Take `slots` and the `gpus` lowest free GPUs of `node`; returns the GPU ids."""
        part = self.partitions[self.part_index[node]]
        mask = self.free_mask[node]
        part._remove(node, (mask.bit_count(), self.free_slots[node]))
        ids = self.gpu_ids[node]
        taken = []
        for _ in range(gpus):
            low = mask & -mask
            mask ^= low
            taken.append(ids[low.bit_length() - 1])
        self.free_mask[node] = mask
        self.free_slots[node] -= slots
        part._add(node, (mask.bit_count(), self.free_slots[node]))
        return tuple(taken)
