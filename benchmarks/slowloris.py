"""A gateway under connection floods: `/v1/health` latency while 1,000 half-open
connections are held (slowloris), and another tenant's latency while one tenant holds
its full quota of event streams (issue 19).

How: a detached gateway (subprocess, 1 virtual node, temporary home, default options
but for the stream caps given) started with a soft open-files limit of 1,024, as on a
host with the default limit (the gateway raises it to the hard limit itself). Health
is probed `--probes` times on fresh connections, one after the other:

* idle;
* while `--half-open` connections from 127.0.0.1 each hold half a request line
  (`GET /v1/health HTT`) and never finish it; the count the gateway closed (past the
  per-address cap) is reported;
* tenant B's `GET /v1/jobs`, idle and while tenant A holds `--streams` event streams
  on a running job (its cap; two tokens), and whether A's next stream is refused.

    .venv/bin/python benchmarks/slowloris.py --half-open 1000 --streams 64
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import select
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, free_port, header, markdown_table, percentile, write_result  # noqa: E402

SLEEPER = "import time\ntime.sleep(600)\n"


@contextlib.contextmanager
def soft_nofile(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def probe(get: Callable[[], requests.Response], num: int) -> dict[str, float]:
    """Latency in ms of `num` calls of `get` (each must answer 200); failures counted."""
    times, failed = [], 0
    for _ in range(num):
        start = time.perf_counter()
        try:
            ok = get().status_code == 200
        except requests.RequestException:
            ok = False
        if ok:
            times.append((time.perf_counter() - start) * 1000)
        else:
            failed += 1
    return {
        "median_ms": statistics.median(times) if times else float("nan"),
        "p99_ms": percentile(times, 99) if times else float("nan"),
        "max_ms": max(times) if times else float("nan"),
        "failed": failed,
    }


def closed_by_server(socks: list[socket.socket]) -> int:
    closed = 0
    for s in socks:
        poller = select.poll()  # select() takes no descriptor past 1023
        poller.register(s, select.POLLIN)
        if poller.poll(0):
            try:
                data = s.recv(1)
            except OSError:
                data = b""
            closed += not data
    return closed


def half_open_health(url: str, port: int, count: int, probes: int) -> tuple[dict[str, float], int]:
    """Health latency while `count` half-open connections are held, and how many of
    them the gateway closed."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    socks: list[socket.socket] = []
    with soft_nofile(hard):
        try:
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(b"GET /v1/health HTT")
                socks.append(s)
            flooded = probe(lambda: requests.get(f"{url}/v1/health", timeout=10), probes)
            time.sleep(1)
            return flooded, closed_by_server(socks)
        finally:
            for s in socks:
                s.close()


def before(tree: Path, count: int, probes: int) -> tuple[dict[str, float], dict[str, float], int]:
    """The same against the AIR of `tree` (idle, flooded, closed): its gateway started
    by hand from AIR_GATEWAY_* variables (its GatewayOptions lacks today's fields)."""
    import os
    import subprocess

    port, home = free_port(), Path(tempfile.mkdtemp(prefix="air-bench-before-"))
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "AIR_GATEWAY_PORT": str(port),
        "AIR_GATEWAY_HOME": str(home),
        "AIR_GATEWAY_NUM_NODES": "1",
        "AIR_GATEWAY_WRITE_CLIENT_CONFIG": "false",
    }
    url = f"http://127.0.0.1:{port}"
    with soft_nofile(1024):
        proc = subprocess.Popen(
            [sys.executable, "-m", "air_sdk.gateway.server"],
            env=env,
            cwd=home,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{url}/v1/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the gateway of the base tree did not start")
            time.sleep(0.2)
        idle = probe(lambda: requests.get(f"{url}/v1/health", timeout=10), probes)
        flooded, closed = half_open_health(url, port, count, probes)
        return idle, flooded, closed
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--half-open", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=64, help="tenant A's stream cap")
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--base-tree", type=Path, help="also run the AIR of this tree")
    args = parser.parse_args()

    from air_sdk.client import Client
    from air_sdk.gateway.server import GatewayOptions, start_detached, stop_detached
    from air_sdk.gateway_config import RequestLimits

    home = Path(tempfile.mkdtemp(prefix="air-bench-slowloris-"))
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=1,
        write_client_config=False,
        limits=RequestLimits(
            user_rate=None,
            anonymous_rate=None,  # the probes measure latency, not the rate limit
            max_streams_per_tenant=args.streams,
            max_streams_per_token=(args.streams + 1) // 2,
        ),
    )
    with soft_nofile(1024):
        gw = start_detached(opts)
    session_get = requests.get
    health = lambda: session_get(f"{gw.url}/v1/health", timeout=10)  # noqa: E731
    rows, result = [], {}
    try:
        idle = probe(health, args.probes)
        rows.append(
            [
                "health, idle",
                *(fmt(idle[k], 1) for k in ("median_ms", "p99_ms", "max_ms")),
                idle["failed"],
            ]
        )
        flooded, closed = half_open_health(gw.url, opts.port, args.half_open, args.probes)
        rows.append(
            [
                f"health, {args.half_open} half-open",
                *(fmt(flooded[k], 1) for k in ("median_ms", "p99_ms", "max_ms")),
                flooded["failed"],
            ]
        )
        result["half_open"] = {"idle": idle, "flooded": flooded, "closed_by_gateway": closed}

        admin = Client(gw.url, gw.token)
        for tenant in ("a", "b"):
            admin.admin.create_tenant(tenant)
        a_tokens = [admin.admin.create_token(tenant="a").token for _ in range(2)]
        b_token = admin.admin.create_token(tenant="b").token
        src = Path(tempfile.mkdtemp(prefix="air-bench-src-"))
        (src / "train.py").write_text(SLEEPER)
        job = Client(gw.url, a_tokens[0]).submit_script(src / "train.py", nodes=1)
        b_list = lambda: session_get(  # noqa: E731
            f"{gw.url}/v1/jobs", headers={"Authorization": f"Bearer {b_token}"}, timeout=30
        )
        b_idle = probe(b_list, args.probes)
        streams = []
        try:
            for i in range(args.streams):
                r = requests.get(
                    f"{gw.url}/v1/jobs/{job.id}/events/stream",
                    headers={"Authorization": f"Bearer {a_tokens[i % 2]}"},
                    stream=True,
                    timeout=30,
                )
                streams.append(r)
            opened = sum(r.status_code == 200 for r in streams)
            extra = requests.get(
                f"{gw.url}/v1/jobs/{job.id}/events/stream",
                headers={"Authorization": f"Bearer {a_tokens[0]}"},
                stream=True,
                timeout=30,
            )
            refused = extra.status_code
            extra.close()
            b_during = probe(b_list, args.probes)
        finally:
            for r in streams:
                r.close()
        job.cancel()
        rows.append(
            [
                "tenant B's list, idle",
                *(fmt(b_idle[k], 1) for k in ("median_ms", "p99_ms", "max_ms")),
                b_idle["failed"],
            ]
        )
        rows.append(
            [
                f"tenant B's list, A holds {opened} streams",
                *(fmt(b_during[k], 1) for k in ("median_ms", "p99_ms", "max_ms")),
                b_during["failed"],
            ]
        )
        result["streams"] = {
            "opened": opened,
            "next_status": refused,
            "idle": b_idle,
            "during": b_during,
        }
    finally:
        stop_detached(home)
    if args.base_tree is not None:
        b_idle, b_flooded, b_closed = before(args.base_tree.resolve(), args.half_open, args.probes)
        rows.append(
            [
                "before: health, idle",
                *(fmt(b_idle[k], 1) for k in ("median_ms", "p99_ms", "max_ms")),
                b_idle["failed"],
            ]
        )
        rows.append(
            [
                f"before: health, {args.half_open} half-open",
                *(fmt(b_flooded[k], 1) for k in ("median_ms", "p99_ms", "max_ms")),
                b_flooded["failed"],
            ]
        )
        result["before"] = {"idle": b_idle, "flooded": b_flooded, "closed_by_gateway": b_closed}
    print(header("Gateway under connection floods (issue 19)"))
    print(
        f"\n{args.probes} probes each, fresh connections; {result['half_open']['closed_by_gateway']} of {args.half_open} half-open connections closed by the gateway; tenant A's stream {args.streams + 1} answered {result['streams']['next_status']}\n"
    )
    print(markdown_table(["what", "median ms", "p99 ms", "max ms", "failed"], rows))
    print(f"\nwrote {write_result('slowloris', {'args': vars(args), **result})}")


if __name__ == "__main__":
    main()
