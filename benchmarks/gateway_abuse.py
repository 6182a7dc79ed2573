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

`--flood-mib N` adds the issue-14 log flood: a real 1-rank job posts N MiB of log
lines (1 MiB reports, with its own worker token, as fast as the gateway takes them);
then `GET .../logs` is read to the end, page by page while the answer says `more`
(a gateway without paging answers everything at once). Reported: how long the flood
took, the log bytes the gateway kept for the job, the largest single answer, and
the gateway's RSS before the flood, after it, and at its peak while answering.

    .venv/bin/python benchmarks/gateway_abuse.py --runs 3 --flood-mib 160
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
MIB = 1 << 20


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


FLOOD_CODE = """
import json, requests
from air_sdk.runtime._context import context, job_token
from air_sdk.runtime._poster import report_url
body = json.dumps({"rank": 0, "lines": ["x" * 1023] * 1024}).encode()  # 1 MiB of text
session = requests.Session()
headers = {"Authorization": f"Bearer {job_token()}", "Content-Type": "application/json"}
for _ in range(%d):
    session.post(report_url(context()), data=body, headers=headers, timeout=120).raise_for_status()
"""


class RssPeak:
    """The peak RSS of a process, sampled every 20 ms on a thread."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def flood(client: Any, gw: Any, home: Path, mib: int) -> dict[str, Any]:
    import sqlite3

    import psutil

    from air_sdk.client.client import job_spec

    rss = psutil.Process(gw.pid).memory_info
    before = rss().rss
    t0 = time.perf_counter()
    job = client.submit(job_spec(code=FLOOD_CODE % mib, name="flood"))
    record = job.wait(timeout=1800)
    flood_s = time.perf_counter() - t0
    after = rss().rss
    db = sqlite3.connect(f"file:{home / 'air.db'}?mode=ro", uri=True)
    kept = db.execute(
        "SELECT COALESCE(SUM(length(CAST(data AS BLOB))), 0) FROM events"
        " WHERE job_id = ? AND type = 'log'",
        (job.id,),
    ).fetchone()[0]
    db.close()
    headers = {"Authorization": f"Bearer {gw.token}"}
    sizes, lines, after_seq = [], 0, 0
    t0 = time.perf_counter()
    with RssPeak(gw.pid) as peak:
        while True:
            r = requests.get(
                f"{gw.url}/v1/jobs/{job.id}/logs",
                params={"after": after_seq},
                headers=headers,
                timeout=600,
            )
            page = r.json()
            sizes.append(len(r.content))
            lines += len(page["lines"])
            if not page.get("more"):
                break
            after_seq = page["last_seq"]
    read_s = time.perf_counter() - t0
    return {
        "state": record.state.value,
        "posted_mib": mib,
        "flood_s": flood_s,
        "kept_mib": kept / MIB,
        "pages": len(sizes),
        "lines_read": lines,
        "largest_answer_mib": max(sizes) / MIB,
        "read_s": read_s,
        "rss_before_mib": before / MIB,
        "rss_after_flood_mib": after / MIB,
        "rss_peak_reading_mib": peak.peak / MIB,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--flood-mib", type=int, default=0, help="Also run the log flood (MiB).")
    a = p.parse_args()
    from air_sdk.gateway.options import RequestLimits

    cap = RequestLimits().max_submit_bytes
    attacks = {
        "8 MB, 700k keys": unknown_keys_body(8_000_000),
        "900 KiB, 80k keys": unknown_keys_body(900 * 1024),
        f"just under the submit cap ({cap >> 10} KiB)": unknown_keys_body(cap - 64),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in attacks}
    flooded: dict[str, Any] = {}
    with air_gateway(num_nodes=1) as (client, gw, home):
        for _ in range(a.runs):
            for name, body in attacks.items():
                result = attack(gw.url, gw.token, body)
                print(name, json.dumps(result), flush=True)
                runs[name].append(result)
        if a.flood_mib:
            flooded = flood(client, gw, home, a.flood_mib)
            print("flood", json.dumps(flooded), flush=True)
    rows = []
    for name, results in runs.items():
        if not results:
            continue
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
    if flooded:
        print()
        print(
            markdown_table(
                list(flooded),
                [[fmt(v, 1) if isinstance(v, float) else v for v in flooded.values()]],
            )
        )
    path = write_result("gateway_abuse", {"runs": runs, "submit_cap": cap, "flood": flooded})
    print(f"\n{path}")


if __name__ == "__main__":
    main()
