"""The whole suite's order: tests that fork DataLoader workers from this process run
first, tests that make this process a Ray driver run last.

A process that joined a Ray cluster keeps Ray's native threads after `ray.shutdown()`
(15 here, gRPC and core-worker threads), and `fork()` copies such a process with
whatever locks those threads held; Ray documents forking a driver as unsupported. Tests
that fork from this process (DataLoader workers, multiprocessing) must not come after
one: the suite's only crash of a DataLoader worker (a SIGSEGV in a `ShardedDataset`
resume test, once in the full runs on record; not reproduced in 40 runs of the data
tests alone nor in 3 runs after the Ray tests) came after the Ray tests had run in the
same process.

Tests that fork DataLoader workers (marked `forks_workers`) run before everything
else, in a process that holds nothing yet of the other tests. After some 1,700 tests
this process holds threads of other libraries (W&B's OpenTelemetry exporters, an AnyIO
portal, tqdm monitors, fsspec's IO loop), pools of OpenMP, and whatever else they left;
the crash then came again without Ray (once in four full runs on 2026-12-03, a
`ShardedDataset` resume test): torch's handler reported a SIGSEGV in a worker, and AIR's
worker start, which enables faulthandler first thing, had not run yet, so the worker
died inside torch's own start-up after `fork()`. It was not reproduced in isolation (280
forks beside recreated W&B exporter threads and busy torch threads). The loader's
own crash path is tested (`test_a_worker_that_crashes_in_native_code_prints_where`).
On 2026-12-03 DataLoader workers hung (300 s) in two full runs in a row, in
`test_failure_save.py` and `test_runtime_data.py`. The cause: `test_failure_save.py`
left DDP models in reference cycles holding destroyed gloo groups, and a worker forked
before this process's next full collection collected them itself; a gloo group's
destructor in a forked child waits forever for worker threads the child does not have.
AIR's loaders and fork checkpoint writer now fork with the parent's objects frozen, so
a child never collects them (air_sdk/runtime/_fork_gc.py, tests/unit/runtime/
test_fork_gc.py), and the gloo fixtures collect right after destroying their group. The
SIGSEGVs above may be the same destructor run in a child; not proven.
Within each group the order stays the collection order.
"""

from __future__ import annotations

import pytest

# the run stops after a few tests timed out (tests/stop_on_timeouts.py)
pytest_plugins = ["stop_on_timeouts"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def group(item: pytest.Item) -> int:
        if item.get_closest_marker("forks_workers") is not None:
            return 0
        return 2 if item.get_closest_marker("ray") is not None else 1

    items.sort(key=group)
