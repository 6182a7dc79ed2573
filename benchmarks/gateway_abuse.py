"""A gateway under abusive requests: how long one oversized JSON body takes to answer,
and how slow `/v1/health` gets for everyone else meanwhile.

How: a real detached gateway (subprocess, temporary home, default options). For each
attack, a background thread polls `GET /v1/health` every 20 ms (a fresh connection each
time, as a load balancer's probe would) from 1 s before the attack until 1 s after
its answer; the attack is one authenticated `POST /v1/jobs` whose body is a JSON object
of N unknown keys (`{"k0000001": 0, ...}`), the shape that makes pydantic list one
error per key. Reported per attack: the answer's status and size, its wall time, and
the median and worst health latency while it ran, against the same probe on the idle
gateway. Attacks:

* `8 MB, 700k keys`: the issue-14 probe's body;
* `900 KiB, 80k keys`: one that fitted every cap before issue 14;
* `just under the submit cap`: the largest body the gateway still parses.

Each attack runs `--runs` times, interleaved; medians are quoted.

    .venv/bin/python benchmarks/gateway_abuse.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import air_gateway, fmt, header, markdown_table, median, write_result  # noqa: E402

PROBE_EVERY_S = 0.02


def unknown_keys_body(num_bytes: int) -> bytes:
    """A JSON object of unknown keys, just under `num_bytes`."""
    per_key = len(b'"k0000000":0,')
    n = max(1, (num_bytes - 2) // per_key)
    return ("{" + ",".join(f'"k{i:07d}":0' for i in range(n)) + "}").encode()


class HealthProbe:
    """Polls /v1/health on its own thread; latencies of the polls that started while
    `window` was open."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []  # (start, latency)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                requests.get(f"{self.url}/v1/health", timeout=60)
            except requests.RequestException:
                pass
            self.samples.append((t0, time.perf_counter() - t0))
            time.sleep(PROBE_EVERY_S)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[float]:
        return [lat for t0, lat in self.samples if start <= t0 <= end]


def attack(url: str, token: str, body: bytes) -> dict[str, Any]:
    with HealthProbe(url) as probe:
        time.sleep(1.0)
        idle = probe.between(0.0, time.perf_counter())
        t0 = time.perf_counter()
        r = requests.post(
            f"{url}/v1/jobs",
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=300,
        )
        t1 = time.perf_counter()
        time.sleep(1.0)
    during = probe.between(t0, t1) or [lat for s, lat in probe.samples if s <= t1][-1:]
    return {
        "status": r.status_code,
        "answer_bytes": len(r.content),
        "answer_s": t1 - t0,
        "health_idle_median_s": median(idle),
        "health_during_median_s": median(during),
        "health_during_max_s": max(during),
        "detail": r.text[:200],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    from air_sdk.gateway.options import RequestLimits

    cap = RequestLimits().max_submit_bytes
    attacks = {
        "8 MB, 700k keys": unknown_keys_body(8_000_000),
        "900 KiB, 80k keys": unknown_keys_body(900 * 1024),
        f"just under the submit cap ({cap >> 10} KiB)": unknown_keys_body(cap - 64),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in attacks}
    with air_gateway() as (_client, gw, _home):
        for _ in range(a.runs):
            for name, body in attacks.items():
                result = attack(gw.url, gw.token, body)
                print(name, json.dumps(result), flush=True)
                runs[name].append(result)
    rows = []
    for name, results in runs.items():
        rows.append(
            [
                name,
                results[0]["status"],
                f"{results[0]['answer_bytes']:,}",
                fmt(median([r["answer_s"] for r in results]), 3),
                fmt(median([r["health_idle_median_s"] * 1000 for r in results]), 1),
                fmt(median([r["health_during_median_s"] * 1000 for r in results]), 1),
                fmt(median([r["health_during_max_s"] * 1000 for r in results]), 1),
            ]
        )
    print()
    print(header("Gateway under abusive bodies"))
    print()
    print(
        markdown_table(
            [
                "attack",
                "status",
                "answer bytes",
                "answer s",
                "health idle ms (median)",
                "health during ms (median)",
                "health during ms (worst)",
            ],
            rows,
        )
    )
    path = write_result("gateway_abuse", {"runs": runs, "submit_cap": cap})
    print(f"\n{path}")


if __name__ == "__main__":
    main()
