"""A tenant's queue-wait SLO burned by real jobs on a real gateway: one slot, a job that
holds it, a second that waits past the target. The waiting job's explanation says the
SLO is at risk, an `slo` event is written once the budget burns past its threshold,
and `/v1/slo`, `air slo` and /metrics show the budget and who burned it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests
from airtest import stop_gateway_and_its_jobs, wait_for
from prometheus_client.parser import text_string_to_metric_families

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import EventType, JobSpec, JobState, SloBurn

pytestmark = pytest.mark.slow

#: half the starts may wait longer than 2 s; the alert at half the budget burned
CLUSTER = """
[tenants.default]
  [[tenants.default.slos]]
  name = "fast-start"
  kind = "queue_wait"
  percentile = 50
  under_s = 2
  alert_burned = 0.5
"""

HOLD = """
import time
import air_sdk.runtime as air
air.init()
for step in range(1, 31):
    air.log(step=step, loss=1.0)
    time.sleep(0.2)
air.shutdown()
"""


@pytest.fixture
def slo_gateway(tmp_path):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(CLUSTER)
    opts = GatewayOptions(
        port=free_port(),
        home=tmp_path / "home",
        num_nodes=1,
        slots_per_node=1,
        cluster_file=cluster,
        write_client_config=False,
    )
    gw = start_detached(opts)
    yield gw
    stop_gateway_and_its_jobs(gw.url, gw.token, opts.home)


def test_a_burned_queue_wait_budget_is_an_event_and_shows_everywhere(slo_gateway, tmp_path):
    gw = slo_gateway
    client = Client(gw.url, gw.token)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(HOLD)
    spec = JobSpec(entrypoint="train.py")
    holder = client.submit(spec, workdir=tmp_path / "src")
    wait_for(lambda: holder.record().state is JobState.RUNNING, 90, "the holder to run")
    waiter = client.submit(spec, workdir=tmp_path / "src")

    def at_risk() -> str | None:
        reason = waiter.record().queue_reason or ""
        return reason if "is at risk" in reason else None

    reason = wait_for(at_risk, 60, "the waiting job's explanation to name the SLO")
    assert "tenant default's SLO 'fast-start' (p50 queue wait under 2 s) is at risk" in reason

    assert waiter.wait(timeout=180).state is JobState.SUCCEEDED
    assert holder.wait(timeout=60).state is JobState.SUCCEEDED

    burns = [
        e.payload_as(SloBurn)
        for job in (holder, waiter)
        for e in job.events(after=0, types=[EventType.SLO]).events
    ]
    assert len(burns) == 1, burns  # once per crossing, not once per later start
    burn = burns[0]
    assert (burn.tenant, burn.slo, burn.kind, burn.threshold) == (
        "default",
        "fast-start",
        "queue_wait",
        0.5,
    )
    assert waiter.id in burn.jobs and burn.budget_left <= 0.5 and burn.burn_rate >= 0.5

    (status,) = client.slo().slos
    assert status.name == "fast-start" and status.num_samples == 2 and status.burning
    assert status.budget_left <= 0 and waiter.id in [b.job_id for b in status.burned_by]
    assert status.value is not None and status.value <= 2  # the p50: the holder's short wait

    env = {**os.environ, "AIR_GATEWAY_URL": gw.url, "AIR_TOKEN": gw.token}
    env.pop("AIR_CONFIG_FILE", None)
    out = subprocess.run(
        [sys.executable, "-m", "air_sdk.cli.main", "slo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "default/fast-start: p50 queue wait under 2 s, over 24 h" in out
    assert "(2 samples)" in out and "BURNING" in out and waiter.id in out

    r = requests.get(
        f"{gw.url}/metrics", headers={"Authorization": f"Bearer {gw.token}"}, timeout=30
    )
    samples = {
        (s.name, s.labels.get("slo")): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    assert samples[("air_slo_burning", "fast-start")] == 1
    assert samples[("air_slo_budget_left_ratio", "fast-start")] == pytest.approx(status.budget_left)
