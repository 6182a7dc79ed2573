"""The global sample order of one epoch: a function of (seed, epoch) and nothing else.

Two levels, as MosaicML Streaming's `py1b` / `py1br`: the shards are permuted, their
samples laid end to end in that order, and that sequence is cut into blocks of
`block` samples, each permuted on its own. Sample i of the epoch is then found in
O(log shards): its block's permutation (computed once per block, O(block), and
cached), then a binary search over the permuted shards' cumulative sizes. A resume
at any position costs the same: nothing is iterated to get there.

Unlike Streaming, the order does not depend on the number of nodes (Streaming's
`num_canonical_nodes`): ranks read the one global order with a stride (rank r of D
takes positions r, r + D, ...), so any world size consumes the same sequence. The
price is that every node reads from the same window of shards at a time, about
`block / samples_per_shard + 1` of them, rather than each node its own.

Example:
    >>> order = GlobalOrder([3, 2], seed=0, epoch=0, shuffle=False, block=4)
    >>> [order.locate(i) for i in range(5)]
    [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    >>> shuffled = GlobalOrder([3, 2], seed=0, epoch=0, shuffle=True, block=4)
    >>> sorted(shuffled.locate(i) for i in range(5))
    [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["DEFAULT_BLOCK", "GlobalOrder"]

#: Streaming's default block (`1 << 18`, for 1 node): big enough that neighbours in the
#: order come from ~block/shard_size different shards, small enough that a block's
#: permutation (2 MiB of int64) is cheap to compute on a resume.
DEFAULT_BLOCK = 1 << 18
_CACHED_BLOCKS = 2  # a rank's reads straddle at most two blocks at a time


class GlobalOrder:
    """Where global position i of epoch `epoch` is: `locate(i) -> (shard, sample in shard)`.

    `counts[s]` is shard s's number of samples, shards in index order.
    """

    def __init__(
        self, counts: Sequence[int], *, seed: int, epoch: int, shuffle: bool, block: int
    ) -> None:
        if seed < 0 or epoch < 0:
            raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
        if block < 1:
            raise ValueError(f"shuffle_block must be >= 1, got {block}")
        sizes = np.asarray(counts, dtype=np.int64)
        self.seed, self.epoch, self.shuffle, self.block = seed, epoch, shuffle, block
        self.num_samples = int(sizes.sum())
        if shuffle:
            rng = np.random.default_rng([seed, epoch, 0])
            self._shards = rng.permutation(len(sizes))
        else:
            self._shards = np.arange(len(sizes))
        permuted = sizes[self._shards]
        self._ends = np.cumsum(permuted)
        self._begins = self._ends - permuted
        self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        #: block permutations computed (what a resume costs, whatever its position)
        self.num_blocks_computed = 0

    def _block(self, number: int) -> np.ndarray:
        cached = self._blocks.get(number)
        if cached is not None:
            self._blocks.move_to_end(number)
            return cached
        start = number * self.block
        length = min(self.block, self.num_samples - start)
        rng = np.random.default_rng([self.seed, self.epoch, 1, number])
        permutation = rng.permutation(length)
        self.num_blocks_computed += 1
        self._blocks[number] = permutation
        if len(self._blocks) > _CACHED_BLOCKS:
            self._blocks.popitem(last=False)
        return permutation

    def permuted(self, i: int) -> int:
        """Global position i's place in the shard-shuffled concatenation."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"position {i} is not in [0, {self.num_samples})")
        if not self.shuffle:
            return i
        number, offset = divmod(i, self.block)
        return number * self.block + int(self._block(number)[offset])

    def locate(self, i: int) -> tuple[int, int]:
        """(shard index, sample within that shard) of global position i."""
        j = self.permuted(i)
        k = int(np.searchsorted(self._ends, j, side="right"))
        return int(self._shards[k]), j - int(self._begins[k])

    def shards_after(self, position: int, *, stride: int = 1, limit: int) -> list[int]:
        """The first `limit` different shards read from global `position` on, taking
        every `stride`-th position (a data-parallel rank's share), in the order they are
        first read: what to prefetch.

        Exact within `position`'s block (its permutation is the one being read, so it
        is cached); later blocks contribute the shards their stretch of the
        shard-shuffled sequence covers, in sequence order, without computing their
        permutations (all of a block's shards are needed while it is read).

        Example:
            >>> order = GlobalOrder([3, 2, 4], seed=0, epoch=0, shuffle=False, block=4)
            >>> order.shards_after(2, limit=2), order.shards_after(3, limit=5)
            ([0, 1], [1, 2])
        """
        if limit < 1 or stride < 1:
            raise ValueError(f"limit and stride must be >= 1, got {limit} and {stride}")
        if position < 0:
            raise IndexError(f"position {position} is negative")
        if position >= self.num_samples:
            return []
        found: list[int] = []
        begin = position
        if self.shuffle:
            number, offset = divmod(position, self.block)
            start = number * self.block
            permutation = self._block(number)
            reads = start + permutation[offset::stride]
            ks = np.searchsorted(self._ends, reads, side="right")
            _, first = np.unique(ks, return_index=True)
            found = [int(self._shards[k]) for k in ks[np.sort(first)][:limit]]
            begin = start + len(permutation)
        k = int(np.searchsorted(self._ends, begin, side="right"))
        while len(found) < limit and k < len(self._shards):
            shard = int(self._shards[k])
            if self._ends[k] > self._begins[k] and shard not in found:
                found.append(shard)
            k += 1
        return found
