"""The operator's node health probe (`air gateway start --node-probe CMD`): a probe
that fails on one node (through a file the test controls) keeps that node out of
placements, shown in `/v1/cluster` and `air admin node list`; once it passes the node
is placed on again. A job that fails on a node whose probe fails is requeued
without it (the failure probes the node before the restart picks its nodes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from airtest import stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client, Job
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

#: fails on every node named in the file beside it, passes elsewhere
PROBE = """
import os, pathlib, sys
bad = pathlib.Path(sys.argv[1]).read_text().split()
node = os.environ["AIR_NODE_NAME"]
if node in bad:
    sys.exit(f"{node} is marked bad")
"""

QUICK = """
import air_sdk.runtime as air
air.init()
air.log(step=1, loss=1.0)
air.shutdown()
"""

#: the rank on a node the file argv[1] names exits 3 (once it does), the others wait to
#: be stopped
CRASH_ON = """
import os, pathlib, sys, time
import air_sdk.runtime as air
air.init()
bad = pathlib.Path(sys.argv[1])
deadline = time.time() + 600
while time.time() < deadline:
    if os.environ["AIR_NODE_NAME"] in bad.read_text().split():
        sys.exit(3)
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """(the gateway, its admin client, the file that marks nodes bad) on 2 nodes, the
    probe run every second."""
    home = tmp_path_factory.mktemp("probe-home")
    work = tmp_path_factory.mktemp("probe")
    bad = work / "bad-nodes"
    bad.write_text("")
    script = work / "probe.py"
    script.write_text(textwrap.dedent(PROBE))
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=1,
        write_client_config=False,
        node_probe=f"{sys.executable} {script} {bad}",
        node_probe_interval_s=1.0,
    )
    gw = start_detached(opts)
    yield gw, Client(gw.url, gw.token), bad
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


def submit(client: Client, tmp_path, source: str, name: str, **spec) -> Job:
    src = tmp_path / name
    src.mkdir()
    (src / "train.py").write_text(source)
    return client.submit(JobSpec(name=name, entrypoint="train.py", **spec), workdir=src)


def node(client: Client, name: str):
    return next(n for n in client.inventory().nodes if n.name == name)


def test_a_failing_probe_keeps_its_node_out_until_it_passes(probed, tmp_path):
    gw, admin, bad = probed
    wait_for(lambda: node(admin, "node-1").probe is not None, 60, "the first probe")
    assert node(admin, "node-1").probe.ok and node(admin, "node-1").healthy
    bad.write_text("node-1\n")
    wait_for(lambda: not node(admin, "node-1").healthy, 60, "node-1 out")
    seen = node(admin, "node-1").probe
    assert not seen.ok and "node-1 is marked bad" in seen.detail and seen.at > 0
    assert node(admin, "node-0").healthy and node(admin, "node-0").probe.ok
    # the operator's listing shows the probe and when it ran
    env = {**os.environ, "AIR_GATEWAY_URL": gw.url, "AIR_TOKEN": gw.token}
    env.pop("AIR_CONFIG_FILE", None)
    cli = [sys.executable, "-m", "air_sdk.cli.main", "admin", "node", "list"]
    listed = subprocess.run([*cli, "--json"], env=env, capture_output=True, text=True)
    rows = {n["name"]: n for n in json.loads(listed.stdout)}
    assert rows["node-1"]["healthy"] is False and rows["node-1"]["probe"]["ok"] is False
    table = subprocess.run(cli, env=env, capture_output=True, text=True).stdout
    assert "PROBE" in table and "failed" in table
    # placements avoid it: two 1-node jobs both run on node-0; a 2-node job waits
    for i in range(2):
        job = submit(admin, tmp_path, QUICK, f"one-{i}", resources=Resources(nodes=1))
        assert job.wait(timeout=180).state is JobState.SUCCEEDED
        assert [a.node for a in job.attempts()[0].placement.nodes] == ["node-0"]
    both = submit(admin, tmp_path, QUICK, "both", resources=Resources(nodes=2))
    wait_for(lambda: both.record().queue_reason, 60, "a reason to wait")
    assert both.status() is JobState.QUEUED
    # the probe passes again: the node returns and the waiting job runs on it
    bad.write_text("")
    record = both.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert node(admin, "node-1").healthy and node(admin, "node-1").probe.ok


def test_a_job_failing_on_a_node_whose_probe_fails_is_requeued_without_it(probed, tmp_path):
    gw, admin, bad = probed
    wait_for(lambda: node(admin, "node-1").healthy, 60, "node-1 healthy")
    job = submit(
        admin,
        tmp_path,
        CRASH_ON,
        "crash-on-1",
        resources=Resources(nodes=2),
        max_restarts=3,
        args=[str(bad)],
    )
    # Marked bad once the job runs on it: marked before, the periodic probe could take
    # node-1 out before the job was placed, which would then wait for two nodes instead.
    wait_for(lambda: job.status() is JobState.RUNNING, 120, "the job running on both nodes")
    bad.write_text("node-1\n")
    # the failure on node-1 sends the job back to the queue without node-1
    wait_for(
        lambda: "without unhealthy node node-1" in (job.record().state_reason or ""),
        120,
        "the job requeued without node-1",
    )
    bad.write_text("")
    job.cancel()
    assert job.wait(timeout=120).state is JobState.CANCELLED
