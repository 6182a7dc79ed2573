"""Multi-tenant scheduling end to end, through a real gateway and real gloo jobs: a
high-priority job preempts a running low-priority one, which saves on SIGTERM, goes
back to the queue and resumes from that checkpoint; a tenant over its quota waits
(and says why) while another tenant's job runs."""

from __future__ import annotations

import pytest
from airtest import no_processes_left, stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

# Checkpoints only when asked to stop: a resume can only come from that save.
PREEMPTIBLE = """
import sys, time
import torch
import air_sdk.runtime as air

total = int(sys.argv[1])
ctx = air.init()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optim = torch.optim.SGD(model.parameters(), lr=0.01)
state = {"model": model, "optim": optim}
step = air.checkpoint.load(state) or 0
print(f"attempt {ctx.attempt} resumes after step {step}", flush=True)
while step < total:
    step += 1
    optim.zero_grad()
    loss = model(torch.ones(2, 4)).pow(2).mean()
    loss.backward()
    optim.step()
    air.log(step=step, loss=loss.item())
    time.sleep(0.05)
    if air.should_stop():
        print(f"rank {ctx.rank} saving at step {step} before stopping", flush=True)
        air.checkpoint.save(state, step=step)
        air.exit_stopped()
air.shutdown()
"""

QUICK = """
import sys, time
import air_sdk.runtime as air
air.init()
for step in range(1, int(sys.argv[1]) + 1):
    air.log(step=step, loss=1.0 / step)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.05)
air.shutdown()
"""


def submit(client: Client, src, *, nodes=2, args=(), **spec):
    return client.submit(
        JobSpec(entrypoint="train.py", args=list(args), resources=Resources(nodes=nodes), **spec),
        workdir=src,
    )


def test_high_priority_preempts_low_which_resumes_from_its_sigterm_checkpoint(
    gateway, workdir, tmp_path
):
    low = submit(gateway, workdir(PREEMPTIBLE), args=["160"], priority="low", max_restarts=0)
    wait_for(lambda: (low.snapshot().step or 0) >= 10, 120, "low at step 10")
    quick = tmp_path / "quick"
    quick.mkdir()
    (quick / "train.py").write_text(QUICK)
    high = submit(gateway, quick, args=["20"], priority="high")

    # the low job leaves its nodes and waits in line, saying why
    wait_for(lambda: low.status() is JobState.QUEUED, 90, "low requeued")
    waiting = low.record()
    assert f"preempted for high-priority job {high.id}" in waiting.state_reason
    wait_for(lambda: bool(low.record().queue_reason), 30, "a reason in the queue")

    assert high.wait(timeout=180).state is JobState.SUCCEEDED
    record = low.wait(timeout=240)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert (record.num_restarts, record.charged_restarts) == (1, 0)  # not a failure
    first, second = low.attempts()
    assert first.failure is not None and first.failure.kind == "preempted"
    saved = [c.step for c in low.checkpoints().commits]
    assert len(saved) == 1 and second.resumed_from_step == saved[0] >= 10
    assert high.attempts()[0].started_at <= second.started_at
    lines = [line.text for line in low.logs()]
    assert f"attempt {second.attempt} resumes after step {saved[0]}" in lines
    assert no_processes_left(low.id) and no_processes_left(high.id)


@pytest.fixture(scope="module")
def quota_gateway(tmp_path_factory):
    """A gateway whose cluster file caps tenant 'vision' at 1 rank slot."""
    home = tmp_path_factory.mktemp("quota-home")
    cluster = home / "cluster.toml"
    cluster.write_text('[tenants.vision]\nslots = 1\n\n[tenants."*"]\nslots = 4\n')
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        cluster_file=cluster,
    )
    gw = start_detached(opts)
    yield Client(gw.url, gw.token)
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


def test_a_tenant_over_quota_waits_and_another_tenant_runs(quota_gateway, workdir):
    admin = quota_gateway
    for name in ("vision", "nlp"):
        admin.admin.create_tenant(name)
    vision = Client(admin.gateway_url, admin.admin.create_token(tenant="vision").token)
    nlp = Client(admin.gateway_url, admin.admin.create_token(tenant="nlp").token)
    src = workdir(QUICK)
    first = submit(vision, src, nodes=1, args=["60", "0.1"])
    wait_for(lambda: first.status() is JobState.RUNNING, 120, "vision's first job running")
    second = submit(vision, src, nodes=1, args=["5"])
    wait_for(lambda: bool(second.record().queue_reason), 30, "the scheduler's reason")
    record = second.record()
    assert record.state is JobState.QUEUED
    assert record.queue_reason.startswith("over quota: tenant 'vision' uses 1 of its 1")
    # the other node is free and another tenant may use it
    other = submit(nlp, src, nodes=1, args=["5"])
    assert other.wait(timeout=120).state is JobState.SUCCEEDED
    assert second.status() is JobState.QUEUED
    assert first.wait(timeout=120).state is JobState.SUCCEEDED
    assert second.wait(timeout=120).state is JobState.SUCCEEDED
    # neither tenant sees the other's jobs
    assert {j.id for j in nlp.jobs()} == {other.id}
