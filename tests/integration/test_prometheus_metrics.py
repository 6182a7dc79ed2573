"""/metrics of a real gateway after a known sequence of real jobs: one succeeds, one
fails and restarts, one is cancelled. Parsed with prometheus_client's own parser."""

from __future__ import annotations

import pytest
import requests
from airtest import wait_for
from prometheus_client.parser import text_string_to_metric_families

from air_sdk.client import Client
from air_sdk.schema import JobSpec, JobState

pytestmark = pytest.mark.slow

OK = """
import air_sdk.runtime as air
air.init()
for step in range(1, 6):
    air.log(step=step, loss=1.0 / step)
air.shutdown()
"""

CRASH = """
import sys
print("failing on purpose", flush=True)
sys.exit(3)
"""

SLEEP = """
import time
import air_sdk.runtime as air
air.init()
for step in range(100000):
    air.log(step=step, alive=1.0)
    time.sleep(0.2)
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, token: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{url}/metrics", headers=headers, timeout=30)


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def run(client: Client, src, **spec):
    return client.submit(
        JobSpec(
            entrypoint="train.py",
            failure={"backoff_base_s": 0.2, "backoff_max_s": 0.5},
            **spec,
        ),
        workdir=src,
    )


def test_metrics_count_a_known_sequence_of_jobs(gateway_process, gateway, tmp_path):
    sources = {}
    for name, text in {"ok": OK, "crash": CRASH, "sleep": SLEEP}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(text)
        sources[name] = tmp_path / name
    before = parse(scrape(gateway_process.url, gateway_process.token).text)

    ok = run(gateway, sources["ok"])
    crash = run(gateway, sources["crash"], max_restarts=1)
    assert ok.wait(timeout=120).state is JobState.SUCCEEDED
    failed = crash.wait(timeout=120)
    assert failed.state is JobState.FAILED and failed.num_restarts == 1
    sleepy = run(gateway, sources["sleep"])
    wait_for(lambda: (sleepy.snapshot().step or 0) >= 2, 90, "the sleepy job to log")
    sleepy.cancel()
    assert sleepy.wait(timeout=60).state is JobState.CANCELLED

    r = scrape(gateway_process.url, gateway_process.token)  # the embedded system admin
    assert r.status_code == 200, r.text
    m = parse(r.text)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return m.get(key, 0.0) - before.get(key, 0.0)

    for state in ("SUCCEEDED", "FAILED", "CANCELLED"):
        assert grew("air_jobs", tenant="default", state=state) == 1, state
        assert grew("air_jobs_finished_total", tenant="default", state=state) == 1, state
    assert grew("air_jobs", tenant="default", state="RUNNING") == 0
    assert grew("air_job_restarts_total", tenant="default", reason="crash") == 1
    # each job left the queue once: a restart relaunches without queueing again
    assert (
        grew("air_queue_wait_seconds_count", tenant="default", pool="default", priority="normal")
        == 3
    )
    assert grew("air_job_goodput_ratio_count", tenant="default") == 3
    assert grew("air_ingest_points_total") >= 5 + 2  # the ok job's 5 and the sleepy one's
    # the ranks' shippers post msgpack reports (JSON only to a gateway that cannot read it)
    assert grew("air_ingest_reports_total", format="msgpack") >= 2
    assert m[("air_scheduler_cycle_seconds_count", ())] > before.get(
        ("air_scheduler_cycle_seconds_count", ()), 0
    )
    assert m[("air_node_healthy", (("node", "node-0"),))] == 1
    assert m[("air_store_size_bytes", ())] > 0


def test_who_may_scrape_a_real_gateway(gateway_process, gateway):
    url = gateway_process.url
    # the embedded gateway binds 127.0.0.1, so a local scraper needs no token (auto)
    assert scrape(url, None).status_code == 200
    created = gateway.admin.create_token(role="metrics", name="prometheus")
    assert scrape(url, created.token).status_code == 200
    other = requests.get(
        f"{url}/v1/jobs", headers={"Authorization": f"Bearer {created.token}"}, timeout=30
    )
    assert other.status_code == 403 and "reads /metrics only" in other.json()["detail"]
    member = gateway.admin.create_token(role="member", name="someone")
    r = scrape(url, member.token)
    assert r.status_code == 403 and "needs a metrics token" in r.json()["detail"]
