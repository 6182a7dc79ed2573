"""Ray: `air cancel` overrides a long preemption grace (issue 19). A Ray-backed job that
ignores SIGTERM, with `preemption_grace_s` at the operator's cap of 900 s, is preempted
by a high-priority job; a cancel during its grace stops it within the operator's bound
(`runner/stopping.py: CANCEL_OVERRIDE_S`, 10 s), leaving no actor, placement group or
process behind, and the preemptor runs. The local backend's twin is
`test_tenant_shares.py: test_cancel_overrides_a_long_preemption_grace`."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airtest import no_processes_left, stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, GatewayProcess, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.runner.backends.ray_connect import reload_ray_config
from air_sdk.runner.stopping import CANCEL_OVERRIDE_S
from air_sdk.schema import FailurePolicySpec, JobSpec, JobState, Resources

ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install air-runtime[ray]`")

pytestmark = [pytest.mark.slow, pytest.mark.ray]

#: the operator's cap on preemption_grace_s; the job asks for all of it
GRACE_CAP_S = 900.0

#: logs a step now and then; ignores SIGTERM (a job that will not be preempted)
STUBBORN = """
import signal, time
import air_sdk.runtime as air
signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
air.init(timeout_s=60)
step = 0
while True:
    step += 1
    air.log(step=step, loss=1.0)
    time.sleep(0.2)
"""

QUICK = """
import air_sdk.runtime as air
air.init(timeout_s=60)
for step in range(1, 4):
    air.log(step=step, loss=1.0 / step)
air.shutdown()
"""


@pytest.fixture(scope="module")
def ray_gateway() -> Iterator[tuple[Any, GatewayProcess]]:
    """A simulated Ray cluster (a CPU-less head, two 1-CPU workers) and a gateway on it
    that caps the preemption grace at GRACE_CAP_S."""
    from ray.cluster_utils import Cluster

    # Unix socket paths must stay under 107 characters: a short directory of our own.
    tmp = Path(tempfile.mkdtemp(prefix="airray-", dir="/tmp"))
    (tmp / "ray").mkdir()
    storage = tmp / "shared"
    storage.mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", str(tmp))
        env.setenv("RAY_AUTH_MODE", "token")
        env.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
        env.setenv("AIR_RAY_STORAGE", str(storage))
        env.setenv("OMP_NUM_THREADS", "1")
        env.delenv("RAY_ADDRESS", raising=False)
        reload_ray_config()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "gcs_server_port": free_port(),
            },
        )
        gw = None
        home = tmp / "home"
        try:
            for _ in range(2):
                cluster.add_node(num_cpus=1, resources={"air_test_node": 1})
            cluster.wait_for_nodes()
            gw = start_detached(
                GatewayOptions(
                    port=free_port(),
                    home=home,
                    backend="ray",
                    ray_address=cluster.address,
                    write_client_config=False,
                    max_preemption_grace_s=GRACE_CAP_S,
                ),
                timeout_s=120,
            )
            yield cluster, gw
        finally:
            if gw is not None:
                stop_gateway_and_its_jobs(gw.url, gw.token, home)
            cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


def _submit(client: Client, tmp_path: Path, source: str, name: str, **spec: Any) -> Any:
    src = tmp_path / name
    src.mkdir()
    (src / "train.py").write_text(source)
    spec.setdefault("resources", Resources(nodes=2))
    return client.submit(JobSpec(name=name, entrypoint="train.py", **spec), workdir=src)


def _left_on_ray(cluster: Any, job_id: str) -> list[str]:
    """The job's actors not dead and placement groups not removed."""
    actors = cluster.global_state.actor_table(None).values()
    groups = cluster.global_state.placement_group_table().values()
    prefix = f"air:{job_id}:"
    return [a["Name"] for a in actors if a.get("Name", "").startswith(prefix)
            if a["State"] != "DEAD"] + [
        p["name"] for p in groups if p.get("name", "").startswith(prefix)
        if p["state"] != "REMOVED"
    ]  # fmt: skip


def test_cancel_overrides_a_long_preemption_grace_on_ray(ray_gateway, tmp_path):
    cluster, gw = ray_gateway
    client = Client(gw.url, gw.token)
    clinging = _submit(
        client,
        tmp_path,
        STUBBORN,
        "clinging",
        priority="low",
        failure=FailurePolicySpec(preemption_grace_s=GRACE_CAP_S),
    )
    wait_for(lambda: clinging.status() is JobState.RUNNING, 240, "the job running on Ray")
    urgent = _submit(client, tmp_path, QUICK, "urgent", priority="high")
    wait_for(
        lambda: any("ignoring SIGTERM" in line.text for line in clinging.logs()),
        120,
        "the preemption's SIGTERM, ignored",
    )
    assert clinging.status() is not JobState.CANCELLED  # in its grace, holding the nodes
    env = {**os.environ, "AIR_GATEWAY_URL": gw.url, "AIR_TOKEN": gw.token}
    env.pop("AIR_CONFIG_FILE", None)
    cancelled_at = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "air_sdk.cli.main", "cancel", clinging.id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    record = clinging.wait(timeout=GRACE_CAP_S / 3)
    took = time.monotonic() - cancelled_at
    assert record.state is JobState.CANCELLED, record.state_reason
    # the operator's bound (10 s) plus a stop on a loaded 2-core machine, never the grace
    assert took < CANCEL_OVERRIDE_S + 60, took
    wait_for(lambda: not _left_on_ray(cluster, clinging.id), 60, "no actor or group left")
    assert no_processes_left(clinging.id)
    assert urgent.wait(timeout=240).state is JobState.SUCCEEDED
