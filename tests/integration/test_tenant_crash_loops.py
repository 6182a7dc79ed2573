"""A tenant's crash loops cost that tenant (issue 19): past its restart allowance
(`max_restarts_per_hour` in the cluster file) its failing jobs fail with the cap in
their reason instead of restarting, the operator sees the count in `air admin tenant
list`, and another tenant's job starts at once on the same nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from airtest import stop_gateway_and_its_jobs

from air_sdk.client import Client, Job
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import FailurePolicySpec, JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

#: the tenants' restart allowance in these tests
CAP = 3

CRASH = "import sys; print('crashing', flush=True); sys.exit(3)\n"

QUICK = """
import air_sdk.runtime as air
air.init()
for step in range(1, 4):
    air.log(step=step, loss=1.0 / step)
air.shutdown()
"""


#: the members' tokens, for the `air` command
TOKENS: dict[str, str] = {}


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    """(the gateway, system admin, member of acme, member of globex) on 2 nodes, every
    tenant allowed CAP restarts an hour."""
    home = tmp_path_factory.mktemp("crash-home")
    cluster = home.parent / "crash-cluster.toml"
    cluster.write_text(f'[tenants."*"]\nmax_restarts_per_hour = {CAP}\n')
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        cluster_file=cluster,
    )
    gw = start_detached(opts)
    admin = Client(gw.url, gw.token)
    members = []
    for name in ("acme", "globex"):
        admin.admin.create_tenant(name)
        token = admin.admin.create_token(tenant=name, role="member").token
        TOKENS[name] = token
        members.append(Client(gw.url, token))
    yield gw, admin, *members
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


def submit(client: Client, tmp_path, source: str, name: str, **spec) -> Job:
    src = tmp_path / name
    src.mkdir()
    (src / "train.py").write_text(source)
    return client.submit(JobSpec(name=name, entrypoint="train.py", **spec), workdir=src)


def air(gw, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIR_GATEWAY_URL": gw.url, "AIR_TOKEN": token or gw.token}
    env.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [sys.executable, "-m", "air_sdk.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_tenants_crash_loops_hit_its_cap_and_another_tenant_starts_at_once(tenants, tmp_path):
    gw, admin, acme, globex = tenants
    no_backoff = FailurePolicySpec(backoff_base_s=0, backoff_max_s=0)
    loops = [
        submit(
            acme,
            tmp_path,
            CRASH,
            f"loop-{i}",
            resources=Resources(nodes=1),
            max_restarts=50,
            failure=no_backoff,
        )
        for i in range(2)
    ]
    for job in loops:
        record = job.wait(timeout=300)
        assert record.state is JobState.FAILED, record.state_reason
        # the tenant sees why in `air status`: its cap, and the setting to change
        assert f"over its cap of {CAP} restarts an hour" in record.state_reason
        assert "max_restarts_per_hour" in record.state_reason
        assert "[tenants.acme]" in record.state_reason
        assert record.charged_restarts < 50  # the job's own budget was far from used
    num_attempts = sum(len(job.attempts()) for job in loops)
    # each job fails at the first crash over the cap: at most one more each
    assert CAP + 1 <= num_attempts <= CAP + 2, num_attempts
    # the restarts before the cap said how much of it was used
    reasons = [e.model_dump_json() for job in loops for e in job.events().events]
    assert any("restarts in the last hour" in r for r in reasons)
    status = air(gw, "status", loops[0].id, token=TOKENS["acme"])
    assert "max_restarts_per_hour" in status.stdout.replace("\n", ""), status.stdout
    # no node was taken from anyone: globex's 2-node job starts on the same nodes at once
    assert all(n.healthy for n in admin.admin.nodes())
    other = submit(globex, tmp_path, QUICK, "globex-after", resources=Resources(nodes=2))
    record = other.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert record.attempt == 1
    # the operator sees each tenant's count against its cap
    by_tenant = {t.id: t for t in admin.admin.tenants()}
    assert by_tenant["acme"].crashes_last_hour == num_attempts
    assert by_tenant["acme"].max_restarts_per_hour == CAP
    assert by_tenant["globex"].crashes_last_hour == 0
    listed = air(gw, "admin", "tenant", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {t["id"]: t for t in json.loads(listed.stdout)}
    assert rows["acme"]["crashes_last_hour"] == num_attempts
    table = air(gw, "admin", "tenant", "list")
    assert "CRASHES" in table.stdout and str(num_attempts) in table.stdout


def test_a_tenant_over_its_cap_fails_a_new_crash_at_once(tenants, tmp_path):
    """Within the hour, a new job of a tenant over its cap is not restarted either."""
    _, admin, acme, _ = tenants
    assert {t.id: t for t in admin.admin.tenants()}["acme"].crashes_last_hour > CAP
    job = submit(acme, tmp_path, CRASH, "one-more", resources=Resources(nodes=1), max_restarts=5)
    record = job.wait(timeout=180)
    assert record.state is JobState.FAILED and record.attempt == 1, record.state_reason
    assert "max_restarts_per_hour" in record.state_reason
    # a job that does not crash runs as ever
    ok = submit(acme, tmp_path, QUICK, "acme-fine", resources=Resources(nodes=1))
    assert ok.wait(timeout=180).state is JobState.SUCCEEDED
