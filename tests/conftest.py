"""The whole suite's order: tests that make this process a Ray driver run last.

A process that joined a Ray cluster keeps Ray's native threads after `ray.shutdown()`
(15 here, gRPC and core-worker threads), and `fork()` copies such a process with
whatever locks those threads held; Ray documents forking a driver as unsupported. Tests
that fork from this process (DataLoader workers, multiprocessing) must not come after
one: the suite's only crash of a DataLoader worker (a SIGSEGV in a `ShardedDataset`
resume test, once in the full runs on record; not reproduced in 40 runs of the data
tests alone nor in 3 runs after the Ray tests) came after the Ray tests had run in the
same process. Within each group the order stays the collection order.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("ray") is not None)
