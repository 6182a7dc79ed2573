"""A member of one tenant against a shared two-tenant gateway (issue 19): it cannot take
the nodes, the priority or the names of another tenant, nor hold a cancel for its
whole preemption grace. Each test is the attack, through a real gateway and real jobs."""

from __future__ import annotations

import pytest
from airtest import no_processes_left, stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client, Job
from air_sdk.errors import ApiError
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import FailurePolicySpec, JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

#: logs a step now and then; ignores SIGTERM (a job that will not be preempted)
STUBBORN = """
import signal, sys, time
import air_sdk.runtime as air
signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
air.init()
step = 0
while True:
    step += 1
    air.log(step=step, loss=1.0)
    time.sleep(0.2)
"""

#: crashes on purpose the way a broken machine would
SEGFAULT = """
import os, signal
os.kill(os.getpid(), signal.SIGSEGV)
"""

QUICK = """
import air_sdk.runtime as air
air.init()
for step in range(1, 4):
    air.log(step=step, loss=1.0 / step)
air.shutdown()
"""

#: the operator's cap on preemption_grace_s in these tests
GRACE_CAP_S = 900.0


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    """(system admin, member of acme, member of globex) on a 2-node gateway."""
    home = tmp_path_factory.mktemp("shares-home")
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        max_preemption_grace_s=GRACE_CAP_S,
    )
    gw = start_detached(opts)
    admin = Client(gw.url, gw.token)
    members = []
    for name in ("acme", "globex"):
        admin.admin.create_tenant(name)
        token = admin.admin.create_token(tenant=name, role="member").token
        members.append(Client(gw.url, token))
    yield admin, *members
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


def submit(client: Client, tmp_path, source: str, name: str, **spec) -> Job:
    src = tmp_path / name
    src.mkdir()
    (src / "train.py").write_text(source)
    spec.setdefault("resources", Resources(nodes=2))
    return client.submit(JobSpec(name=name, entrypoint="train.py", **spec), workdir=src)


def cancel_all(*jobs: Job) -> None:
    for job in jobs:
        job.cancel()
    for job in jobs:
        wait_for(lambda job=job: job.status().terminal, 120, f"{job.id} ended")


def test_a_member_cannot_ask_for_more_priority_or_grace_than_the_operator_allows(tenants):
    _, acme, _ = tenants
    spec = JobSpec(name="grab", code="print(1)", priority="high")
    with pytest.raises(ApiError) as refused:
        acme.submit(spec)
    assert refused.value.status == 403
    assert "max_priority" in refused.value.message and "[tenants.acme]" in refused.value.message
    long_grace = JobSpec(
        name="cling", code="print(1)", failure=FailurePolicySpec(preemption_grace_s=1000)
    )
    with pytest.raises(ApiError) as refused:
        acme.submit(long_grace)
    assert refused.value.status == 403 and f"cap of {GRACE_CAP_S:g} s" in refused.value.message
    assert acme.jobs() == []


def test_another_tenants_jobs_are_never_named(tenants, tmp_path):
    admin, acme, globex = tenants
    secret = submit(
        acme,
        tmp_path,
        STUBBORN,
        "acme-secret-plan",
        priority="low",
        failure=FailurePolicySpec(preemption_grace_s=30),
    )
    wait_for(lambda: secret.status() is JobState.RUNNING, 180, "acme's job running")
    # /v1/cluster: globex sees the nodes used, not whose job uses them
    for who, sees in ((globex, set()), (acme, {secret.id}), (admin, {secret.id})):
        nodes = who.inventory().nodes
        assert {j for n in nodes for j in n.jobs} == sees
        assert sum(n.used_slots for n in nodes) == 2
    urgent = submit(admin, tmp_path, QUICK, "sysadmin-urgent-fix", priority="high")
    waits = submit(globex, tmp_path, QUICK, "globex-waits", resources=Resources(nodes=1))
    # globex waits behind the system admin's job while acme's job is in its grace
    reason = wait_for(
        lambda: (r := waits.record().queue_reason) and "first:" in r and r,
        120,
        "globex's reason to wait",
    )
    assert urgent.id not in reason and secret.id not in reason
    assert "another tenant's job" in reason
    # acme is preempted for the admin's job, and told so without its name
    wait_for(lambda: "preempted" in (secret.record().state_reason or ""), 180, "preempted")
    told = secret.record().state_reason
    assert "another tenant's job" in told and urgent.id not in told, told
    events = secret.events().model_dump_json()
    assert urgent.id not in events and "sysadmin-urgent-fix" not in events
    cancel_all(secret, urgent, waits)


def test_cancel_overrides_a_long_preemption_grace(tenants, tmp_path):
    admin, acme, _ = tenants
    clinging = submit(
        acme,
        tmp_path,
        STUBBORN,
        "clinging",
        priority="low",
        failure=FailurePolicySpec(preemption_grace_s=GRACE_CAP_S),
    )
    wait_for(lambda: clinging.status() is JobState.RUNNING, 180, "the job running")
    urgent = submit(admin, tmp_path, QUICK, "urgent", priority="high")
    wait_for(
        lambda: any("ignoring SIGTERM" in line.text for line in clinging.logs()),
        120,
        "the preemption's SIGTERM, ignored",
    )
    clinging.cancel()
    # far sooner than the 900 s grace (about 10 s, then SIGKILL)
    record = clinging.wait(timeout=300)
    assert record.state is JobState.CANCELLED
    assert no_processes_left(clinging.id)
    assert urgent.wait(timeout=180).state is JobState.SUCCEEDED


def test_one_tenants_crash_loop_leaves_every_node_healthy(tenants, tmp_path):
    admin, acme, globex = tenants
    crashing = submit(
        acme,
        tmp_path,
        SEGFAULT,
        "crash-loop",
        resources=Resources(nodes=1),
        max_restarts=3,
        failure=FailurePolicySpec(backoff_base_s=0, backoff_max_s=0),
    )
    record = crashing.wait(timeout=300)
    assert record.state is JobState.FAILED, record.state_reason
    assert "all 3 restarts used" in record.state_reason
    attempts = crashing.attempts()
    assert len(attempts) == 4 and all(a.failure.signal == "SIGSEGV" for a in attempts)
    # the job used up its own restarts; no node was taken from anyone
    assert all(n.healthy for n in admin.admin.nodes())
    assert all(n.healthy for n in globex.inventory().nodes)
    other = submit(globex, tmp_path, QUICK, "globex-after")  # needs both nodes
    assert other.wait(timeout=180).state is JobState.SUCCEEDED
