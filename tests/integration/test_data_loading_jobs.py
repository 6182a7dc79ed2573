"""Data-loading metrics of real jobs through a real gateway: a loop over a slow loader
wrapped in `air.data.timed` shows its data wait in `air status --json` and in the
monitor's HTML snapshot; a rank stuck downloading a shard is a hang "waiting for data"."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from airtest import no_processes_left, wait_for

from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]

SLOW_LOADER = """
import time

import torch

import air_sdk.runtime as air


def slow_batches():
    for _ in range(16):
        time.sleep(0.25)  # the loader is slow; the step below takes no time
        yield torch.zeros(8, 4)


for step, batch in enumerate(air.data.timed(slow_batches())):
    air.log(step=step, loss=float(batch.sum()))
air.shutdown()
"""


def test_a_slow_loader_shows_as_data_wait_in_status_and_monitor(gateway, gateway_process, workdir):
    job = gateway.submit(
        JobSpec(entrypoint="train.py", resources=Resources(nodes=1)),
        workdir=workdir(SLOW_LOADER),
    )
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())

    env = {
        **os.environ,
        "AIR_GATEWAY_URL": gateway_process.url,
        "AIR_TOKEN": gateway_process.token,
    }
    env.pop("AIR_CONFIG_FILE", None)
    run = subprocess.run(
        [*AIR, "status", job.id, "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)["data_loading"]
    assert data["samples_per_s"] > 0
    assert data["wait_fraction"] > 0.5  # the loop does nothing but wait for its batches
    assert data["slowest_rank"] == 0 and data["waiting"] == {}
    (rank0,) = job.snapshot().data_loading.values()
    assert rank0.latest.num_samples == 16 * 8  # the final totals, sent at shutdown

    run = subprocess.run(
        [*AIR, "status", job.id], env=env, capture_output=True, text=True, timeout=120
    )
    assert re.search(r"data: [\d.]+ samples/s · waits for data \d+% of the time", run.stdout)

    from air_sdk.notebook.monitor import JobMonitor

    monitor = JobMonitor(job)
    try:
        monitor.wait(timeout=120)
        html = monitor._repr_mimebundle_()["text/html"]
    finally:
        monitor.close()
    assert re.search(r"<b>data</b> [\d.]+ samples/s · waits for data \d+% of the time", html)


class _NeverAnswers(http.server.BaseHTTPRequestHandler):
    """A shard server that takes requests and never answers them."""

    release = threading.Event()

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
        self.release.wait(300)

    do_GET = do_HEAD  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stuck_shard_url() -> Iterator[str]:
    pytest.importorskip("aiohttp")  # fsspec's HTTPFileSystem, in the rank
    handler = type("Handler", (_NeverAnswers,), {"release": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/shards"
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()


STUCK_ON_A_SHARD = """
import air_sdk.runtime as air
from air_sdk.runtime.data import ShardStore

store = ShardStore({url!r})


def batches():
    with store.pinned("s-0007.bin") as path:  # the server never sends it
        yield path.read_bytes()


for step in range(3):
    air.log(step=step, loss=1.0)
for batch in air.data.timed(batches()):
    air.log(step=3, loss=0.5)
"""


def test_a_rank_stuck_on_a_shard_is_a_hang_waiting_for_data(gateway, workdir, stuck_shard_url):
    job = gateway.submit(
        JobSpec(
            entrypoint="train.py",
            resources=Resources(nodes=1),
            failure={"hang_timeout_s": 5},
        ),
        workdir=workdir(STUCK_ON_A_SHARD.format(url=stuck_shard_url)),
    )
    record = job.wait(timeout=180)
    assert record.state is JobState.FAILED, record.state_reason
    failure = record.failure
    assert failure.kind == "hang", failure.reason
    assert "rank 0 (last step 2, waiting for data (shard s-0007.bin)) for 5 s" in failure.reason
    wait_for(lambda: no_processes_left(job.id), 30, "no process left")
