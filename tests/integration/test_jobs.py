"""A real gateway and real 2-node gloo jobs: what a user of `air submit` sees."""

from __future__ import annotations

import pytest
from airtest import no_processes_left, wait_for

from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

AIR_SCRIPT = """
import torch, torch.distributed as dist
import air_sdk.runtime as air

ctx = air.init()
torch.manual_seed(0)
w = torch.zeros(4, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
target = torch.arange(4.0)
for step in range(1, 31):
    loss = ((w - target) ** 2).mean()
    opt.zero_grad(); loss.backward()
    dist.all_reduce(w.grad); w.grad /= ctx.world_size
    opt.step()
    air.log(step=step, loss=loss.item())
print(f"rank {ctx.rank} done", flush=True)
air.shutdown()
"""

PLAIN_TORCHRUN_SCRIPT = """
import os, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
print(f"sum={t.item()} rank={rank} world={world} job={os.environ['AIR_JOB_ID']}", flush=True)
dist.destroy_process_group()
"""

FAILING_SCRIPT = """
import os, sys
rank = int(os.environ["RANK"])
if rank == 1:
    print("about to fail on purpose", flush=True)
    sys.exit(7)
import time; time.sleep(60)
"""

SLEEPY_SCRIPT = """
import os, time
import air_sdk.runtime as air
for step in range(100000):
    air.log(step=step, alive=1.0)
    time.sleep(0.2)
"""


def test_two_node_job_succeeds_with_loss_in_metrics(gateway, workdir):
    job = gateway.submit_script(workdir(AIR_SCRIPT) / "train.py", nodes=2, name="ddp")
    record = job.wait(timeout=120)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())
    rows = job.metrics(name="loss")
    assert {r.rank for r in rows} == {0, 1}
    steps = [r.step for r in rows if r.rank == 0]
    assert steps == list(range(1, 31))
    assert rows[-1].values["loss"] < rows[0].values["loss"]
    lines = [line.text for line in job.logs()]
    assert "rank 0 done" in lines and "rank 1 done" in lines
    assert [a.attempt for a in job.attempts()] == [1]


def test_unmodified_torchrun_script_runs(gateway, workdir):
    job = gateway.submit_script(workdir(PLAIN_TORCHRUN_SCRIPT) / "train.py", nodes=2)
    record = job.wait(timeout=120)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())
    texts = [line.text for line in job.logs()]
    assert any(t.startswith("sum=3.0 rank=0 world=2 job=" + job.id) for t in texts), texts


def test_failing_script_reports_rank_exit_code_and_log_tail(gateway, workdir):
    job = gateway.submit_script(workdir(FAILING_SCRIPT) / "train.py", nodes=2)
    record = job.wait(timeout=120)
    assert record.state is JobState.FAILED
    assert record.failure is not None
    assert (record.failure.rank, record.failure.exit_code) == (1, 7)
    assert "about to fail on purpose" in record.failure.log_tail
    assert "rank 1 exit code 7" in record.state_reason
    wait_for(lambda: no_processes_left(job.id), 30, "the job's processes to be gone")


def test_cancel_leaves_no_process_behind(gateway, workdir):
    job = gateway.submit_script(workdir(SLEEPY_SCRIPT) / "train.py", nodes=2)
    wait_for(lambda: job.status() is JobState.RUNNING, 90, "RUNNING")
    wait_for(lambda: job.metrics(), 30, "first metrics")
    # each node's sampler reports its CPU (no GPU here) while the job runs
    wait_for(
        lambda: {key.split("/")[0] for key in job.snapshot().utilization} == {"node-0", "node-1"},
        30,
        "utilization samples from both nodes",
    )
    job.cancel()
    record = job.wait(timeout=60)
    assert record.state is JobState.CANCELLED
    assert no_processes_left(job.id)


def test_jobs_that_do_not_fit_together_run_one_after_the_other(gateway, workdir):
    src = workdir(PLAIN_TORCHRUN_SCRIPT)
    first = gateway.submit_script(src / "train.py", nodes=2, name="first")
    second = gateway.submit_script(src / "train.py", nodes=2, name="second")
    assert second.record().state is JobState.QUEUED
    a, b = first.wait(timeout=120), second.wait(timeout=120)
    assert a.state is b.state is JobState.SUCCEEDED
    # the second one could only start once the first had given its nodes back
    assert b.started_at is not None and a.ended_at is not None and b.started_at >= a.ended_at
