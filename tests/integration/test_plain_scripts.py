"""Plain torchrun scripts (no air.log anywhere) on real 2-node gloo jobs: their hangs
are judged on output and CPU use, their goodput on attempt time."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from airtest import no_processes_left, stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

BLOCKED = """
import datetime, signal
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
if dist.get_rank() == 1:
    signal.pause()  # never prints, never computes: its peer waits in the barrier forever
dist.barrier()
"""

SILENT_WORK = """
import time
import torch.distributed as dist

dist.init_process_group("gloo")
end = time.monotonic() + 15  # 2.5 hang timeouts of busy CPU, not one line printed
x = 0
while time.monotonic() < end:
    x += sum(range(1000))
dist.barrier()
dist.destroy_process_group()
"""


def submit(client: Client, src, **failure) -> object:
    return client.submit(
        JobSpec(entrypoint="train.py", resources=Resources(nodes=2), failure=failure),
        workdir=src,
    )


def test_a_plain_script_blocked_in_a_collective_is_a_hang(gateway, workdir):
    job = submit(gateway, workdir(BLOCKED), hang_timeout_s=5)
    record = job.wait(timeout=180)
    assert record.state is JobState.FAILED, record.state_reason
    failure = record.failure
    assert failure.kind == "hang" and failure.stalled_ranks == [0, 1]
    assert failure.reason.startswith(
        "no air.log step, no output and no CPU/GPU use from ranks 0, 1 for 5 s (hang_timeout_s)"
    ), failure.reason
    assert "signal.pause" in failure.stacks.get(1, "") or "<module>" in failure.stacks.get(1, "")
    wait_for(lambda: no_processes_left(job.id), 30, "no process left")


def test_a_plain_script_computing_silently_is_not_hung_and_has_goodput(gateway, workdir):
    job = submit(gateway, workdir(SILENT_WORK), hang_timeout_s=6)
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert record.failure is None
    (attempt,) = job.attempts()
    assert attempt.productive_s > 12  # the 15 s of work, not launch or teardown
    assert 0 < record.goodput < 1
    wait_for(lambda: no_processes_left(job.id), 30, "no process left")


ALL_REDUCE = """
import torch, torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def default_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """A gateway with the default slots: on this machine's cores, shared by 2 nodes."""
    home = tmp_path_factory.mktemp("air-home-default")
    gw = start_detached(GatewayOptions(port=free_port(), home=home, write_client_config=False))
    yield Client(gw.url, gw.token)
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores for 2 ranks")
def test_the_default_gateway_runs_one_node_of_two_ranks(default_gateway, workdir):
    job = default_gateway.submit(
        JobSpec(entrypoint="train.py", resources=Resources(nodes=1, procs_per_node=2)),
        workdir=workdir(ALL_REDUCE),
    )
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    (attempt,) = job.attempts()
    assert [(a.node, a.slots) for a in attempt.placement.nodes] == [("node-0", 2)]
    assert any("rank 1 of 2: sum 2" in line.text for line in job.logs())
    assert record.goodput is not None and record.goodput > 0
    wait_for(lambda: no_processes_left(job.id), 30, "no process left")
