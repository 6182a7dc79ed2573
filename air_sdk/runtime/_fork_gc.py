"""Processes AIR forks (DataLoader workers of its loaders, the fork checkpoint writer)
never garbage-collect what the parent left.

A forked child inherits the parent's uncollected garbage, and its own cyclic
collector would run those objects' destructors there. Some destructors cannot run in a
child: a gloo process group's (`~ProcessGroupGloo`) joins its worker threads, which the
child does not have, and waits forever. A group destroyed with
`destroy_process_group()` while a DistributedDataParallel model in a reference cycle
still held it is such garbage, and a DataLoader worker forked before the parent's next
full collection hung in its first one (seen in AIR's suite; reproduced in
tests/unit/runtime/test_fork_gc.py).

`gc.freeze()` just before the fork moves every object the parent tracks into the
permanent generation, which the child never collects; `gc.unfreeze()` right after it
gives them back to the parent's oldest generation (a child that leaves the block, as
`os.fork()`'s caller does, keeps them frozen). This is what Python's `gc.freeze`
documentation recommends before a fork (it also spares the child's pages from the
collector's copy-on-write). Both are constant-time. A process that froze objects itself
(`gc.get_freeze_count() > 0`) is left as it is: unfreezing would undo its own freeze.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

__all__ = ["forks_keep_garbage_in_the_parent"]


@contextlib.contextmanager
def forks_keep_garbage_in_the_parent() -> Iterator[None]:
    """Children forked inside this block never collect the parent's garbage.

    Example:
        >>> import gc
        >>> with forks_keep_garbage_in_the_parent():
        ...     gc.get_freeze_count() > 0
        True
        >>> gc.get_freeze_count()
        0
    """
    if gc.get_freeze_count() > 0:  # the process manages freezing itself
        yield
        return
    parent = os.getpid()
    gc.freeze()
    try:
        yield
    finally:
        if os.getpid() == parent:  # a child leaving the block keeps it all frozen
            gc.unfreeze()
