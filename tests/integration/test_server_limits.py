"""The gateway's limits, streams and metric values against a real gateway: what a
diverging job shows, what half-open connections and stream floods leave working."""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from airtest import stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, GatewayProcess, start_detached
from air_sdk.gateway_config import RequestLimits
from air_sdk.notebook.chart import PNG_MAGIC, render_chart_png
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]

DIVERGING = """
import air_sdk.runtime as air
air.init()
air.log(step=1, loss=2.0, grad_norm=1.0)
air.log(step=2, loss=float("nan"), grad_norm=float("inf"))
air.log(step=3, loss=float("-inf"), grad_norm=0.5)
air.log(step=4, loss=float("nan"), grad_norm=0.25)
air.shutdown()
"""


def air(url: str, token: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIR_GATEWAY_URL": url, "AIR_TOKEN": token}
    env.pop("AIR_CONFIG_FILE", None)
    return subprocess.run(
        [*AIR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def test_a_diverging_loss_shows_as_nan_and_inf(gateway, gateway_process, workdir):
    job = gateway.submit_script(workdir(DIVERGING) / "train.py", nodes=1, name="diverge")
    record = job.wait(timeout=120)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())

    snap = job.snapshot()
    assert math.isnan(snap.latest["loss"]) and snap.latest["grad_norm"] == 0.25
    by_step = dict(snap.series["loss"])
    assert by_step[1] == 2.0 and math.isnan(by_step[2]) and by_step[3] == -math.inf
    assert dict(snap.series["grad_norm"])[2] == math.inf
    png = render_chart_png(snap, "loss")
    assert png is not None and png.startswith(PNG_MAGIC)

    url, token = gateway_process.url, gateway_process.token
    status = air(url, token, "status", job.id)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "loss nan" in status.stdout, status.stdout
    metrics = air(url, token, "metrics", job.id, "--all")
    assert metrics.returncode == 0, metrics.stdout + metrics.stderr
    cells = metrics.stdout.split()
    assert "nan" in cells and "inf" in cells and "-inf" in cells, metrics.stdout
    rows = json.loads(air(url, token, "metrics", job.id, "--all", "--json").stdout)
    assert [r["values"]["loss"] for r in rows] == [2.0, "NaN", "-Infinity", "NaN"]


# -- half-open connections (slowloris) ------------------------------------------------------

NUM_HALF_OPEN = 1100  # as the attack: past a default 1,024-file limit
#: a typical host's default soft open-files limit, which the flood used to exhaust
TYPICAL_SOFT_NOFILE = 1024
PER_ADDRESS = 64
STREAMS_PER_TENANT = 3


@contextlib.contextmanager
def soft_nofile(limit: int) -> Iterator[None]:
    """This process's soft open-files limit set to `limit` (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def limited_gateway(home: Path, **options: object) -> GatewayProcess:
    opts = GatewayOptions(
        port=free_port(), home=home, num_nodes=1, write_client_config=False, **options
    )
    with soft_nofile(TYPICAL_SOFT_NOFILE):  # started as on a host with the default limit
        return start_detached(opts)


@pytest.fixture(scope="module")
def capped_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("air-capped")
    gw = limited_gateway(
        home,
        max_connections_per_address=PER_ADDRESS,
        header_timeout_s=600,
        limits=RequestLimits(
            user_rate=None, max_streams_per_tenant=STREAMS_PER_TENANT, max_streams_per_token=2
        ),
    )
    yield gw
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


@contextlib.contextmanager
def half_open(port: int, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections that send half a request line and never finish it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < count + 256:
        pytest.skip(f"this host allows {hard} open files; the test needs {count + 256}")
    socks: list[socket.socket] = []
    try:
        with soft_nofile(hard):
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(b"GET /v1/health HTT")
                socks.append(s)
            yield socks
    finally:
        for s in socks:
            s.close()


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many of `socks` the server closed (readable with nothing left to read)."""
    closed = 0
    for s in socks:
        if s.fileno() < 0:
            closed += 1
            continue
        poller = select.poll()  # select() takes no descriptor past 1023
        poller.register(s, select.POLLIN)
        if poller.poll(0):
            try:
                data = s.recv(1)
            except OSError:
                data = b""
            if not data:
                s.close()
                closed += 1
    return closed


def test_health_list_and_submit_answer_during_1100_half_open_connections(capped_gateway, workdir):
    url, headers = capped_gateway.url, {"Authorization": f"Bearer {capped_gateway.token}"}
    with half_open(int(url.rsplit(":", 1)[1]), NUM_HALF_OPEN) as socks:
        health = requests.get(f"{url}/v1/health", timeout=60)
        assert health.status_code == 200 and health.json()["version"]
        listing = requests.get(f"{url}/v1/jobs", headers=headers, timeout=60)
        assert listing.status_code == 200
        # The address's oldest half-open connections were closed to make room.
        wait_for(
            lambda: closed_by_server(socks) >= NUM_HALF_OPEN - PER_ADDRESS,
            timeout_s=120,
            what="the gateway to close the half-open connections past the per-address cap",
        )
        job = Client(url, capped_gateway.token).submit_script(
            workdir("print('still here')\n") / "train.py", nodes=1
        )
        assert job.wait(timeout=120).state is JobState.SUCCEEDED


def test_a_connection_that_never_finishes_its_headers_is_closed(tmp_path):
    gw = limited_gateway(tmp_path / "home", header_timeout_s=1)
    try:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            assert s.recv(1024) == b""  # closed by the gateway (a timeout would raise)
        # A request that completes its headers is answered as ever.
        assert requests.get(f"{gw.url}/v1/health", timeout=60).status_code == 200
    finally:
        stop_gateway_and_its_jobs(gw.url, gw.token, tmp_path / "home")


# -- event streams ------------------------------------------------------------------------

SLEEPER = "import time\ntime.sleep(600)\n"


@contextlib.contextmanager
def event_stream(url: str, token: str, job_id: str) -> Iterator[requests.Response]:
    r = requests.get(
        f"{url}/v1/jobs/{job_id}/events/stream",
        headers={"Authorization": f"Bearer {token}"},
        stream=True,
        timeout=60,
    )
    try:
        yield r
    finally:
        r.close()


def test_a_tenant_past_its_stream_cap_gets_429_and_others_still_get_answers(
    capped_gateway, workdir
):
    url = capped_gateway.url
    admin = Client(url, capped_gateway.token)
    for tenant in ("acme", "globex"):
        admin.admin.create_tenant(tenant)
    first, second = (admin.admin.create_token(tenant="acme").token for _ in range(2))
    other = admin.admin.create_token(tenant="globex").token
    job = Client(url, first).submit_script(workdir(SLEEPER) / "train.py", nodes=1)
    with contextlib.ExitStack() as open_streams:
        for token in (first, first, second):  # the tenant's cap: 3
            r = open_streams.enter_context(event_stream(url, token, job.id))
            assert r.status_code == 200, r.text
        with event_stream(url, second, job.id) as refused:
            assert refused.status_code == 429
            detail = refused.json()["detail"]
            assert "3 event streams open" in detail and "close streams" in detail
        with event_stream(url, first, job.id) as refused:  # its own cap: 2
            assert refused.status_code == 429 and "this token" in refused.json()["detail"]
        # Another tenant is served, with streams of its own.
        listing = requests.get(
            f"{url}/v1/jobs", headers={"Authorization": f"Bearer {other}"}, timeout=60
        )
        assert listing.status_code == 200 and listing.json()["jobs"] == []
        assert requests.get(f"{url}/v1/health", timeout=60).status_code == 200

    # Closed streams give their slots back.
    def reopened() -> bool:
        with event_stream(url, second, job.id) as r:
            return r.status_code == 200

    wait_for(reopened, timeout_s=60, what="closed streams to give their slots back")
    job.cancel()
    assert job.wait(timeout=120).state is JobState.CANCELLED
