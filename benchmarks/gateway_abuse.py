"""A gateway under abusive requests: how long one oversized JSON body takes to answer,
how slow `/v1/health` gets for everyone else meanwhile, and what a log flood costs.

How: a detached gateway (subprocess, 1 virtual node, temporary home, default
options). With `--base-tree DIR` a second one runs the `air_sdk` of DIR (an older
revision: `git archive REV air_sdk | tar -x -C DIR`) side by side, and every attack
alternates between the two. For each attack, a background thread polls
`GET /v1/health` every 20 ms (a fresh connection each time, as a load balancer's
probe would) from 1 s before the attack until 1 s after its answer; the attack is one
authenticated `POST /v1/jobs` whose body is a JSON object of N unknown keys
(`{"k0000001": 0, ...}`), the shape that makes pydantic list one error per key.
Reported per attack: the answer's status and size, its wall time, and the worst
health latency while it ran. Attacks:

* `8 MB, 700k keys`: the issue-14 probe's body;
* `900 KiB, 80k keys`: one that fitted every cap before issue 14;
* `2 MiB, 160k keys`: just under today's submit cap, the most a body may cost now.

Each attack runs `--runs` times; medians are quoted.

`--flood-mib N` adds the issue-14 log flood on each gateway: a real 1-rank job posts
N MiB of log lines (1 MiB reports, with its own worker token, as fast as the gateway
takes them); then `GET .../logs` is read to the end, page by page while the answer
says `more` (a gateway without paging answers everything at once). Reported: how
long the flood took, the log bytes the gateway kept for the job, the largest single
answer, and the gateway's RSS before the flood, after it, and at its peak while
answering.

    git archive 2339598 air_sdk | tar -x -C /tmp/air-base
    .venv/bin/python benchmarks/gateway_abuse.py --runs 3 --flood-mib 160 --base-tree /tmp/air-base
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, free_port, header, markdown_table, median, write_result  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

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


def flood(url: str, token: str, pid: int, home: Path, mib: int) -> dict[str, Any]:
    import sqlite3

    import psutil

    from air_sdk.client import Client
    from air_sdk.client.client import job_spec

    client = Client(url, token)
    rss = psutil.Process(pid).memory_info
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
    headers = {"Authorization": f"Bearer {token}"}
    sizes, lines, after_seq = [], 0, 0
    t0 = time.perf_counter()
    with RssPeak(pid) as peak:
        while True:
            r = requests.get(
                f"{url}/v1/jobs/{job.id}/logs",
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


@contextmanager
def gateway_process(tree: Path | None) -> Iterator[tuple[str, str, int, Path]]:
    """A detached gateway (1 virtual node, temporary home) running the code of `tree`
    (a directory holding an `air_sdk` package), or of this checkout when None.
    Yields (url, admin token, pid, home)."""
    home = Path(tempfile.mkdtemp(prefix="air-abuse-"))
    port = free_port()
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)  # `-m` puts the cwd first: run from the tree too
    cmd = [sys.executable, "-m", "air_sdk.gateway.server", "--port", str(port)]
    cmd += ["--home", str(home), "--nodes", "1", "--no-client-config"]
    url = f"http://127.0.0.1:{port}"
    with open(home / "bench-gateway.log", "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=tree or REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(f"{url}/v1/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start; see {home}/bench-gateway.log")
            time.sleep(0.2)
        yield url, (home / "token").read_text().strip(), proc.pid, home
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--flood-mib", type=int, default=0, help="Also run the log flood (MiB).")
    p.add_argument(
        "--base-tree",
        type=Path,
        default=None,
        help="A directory with an older air_sdk to run side by side (git archive REV air_sdk).",
    )
    a = p.parse_args()
    attacks = {
        "8 MB, 700k keys": unknown_keys_body(8_000_000),
        "900 KiB, 80k keys": unknown_keys_body(900 * 1024),
        "2 MiB, 160k keys": unknown_keys_body((2 << 20) - 64),
    }
    sides: dict[str, Path | None] = {"AIR": None}
    if a.base_tree is not None:
        sides["base"] = a.base_tree.resolve()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        side: {name: [] for name in attacks} for side in sides
    }
    flooded: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        gateways = {
            side: stack.enter_context(gateway_process(tree)) for side, tree in sides.items()
        }
        for _ in range(a.runs):
            for name, body in attacks.items():
                for side, (url, token, _pid, _home) in gateways.items():
                    result = attack(url, token, body)
                    print(side, name, json.dumps(result), flush=True)
                    runs[side][name].append(result)
        if a.flood_mib:
            for side, (url, token, pid, home) in gateways.items():
                flooded[side] = flood(url, token, pid, home, a.flood_mib)
                print(side, "flood", json.dumps(flooded[side]), flush=True)
    print()
    print(header("Gateway under abusive bodies"))
    print()
    headers = ["attack", "side", "status", "answer bytes", "answer s", "health during ms (worst)"]
    rows = []
    for name in attacks:
        for side in sides:
            results = runs[side][name]
            if results:
                rows.append(
                    [
                        name,
                        side,
                        results[0]["status"],
                        f"{results[0]['answer_bytes']:,}",
                        fmt(median([r["answer_s"] for r in results]), 3),
                        fmt(median([r["health_during_max_s"] * 1000 for r in results]), 1),
                    ]
                )
    idle = [
        r["health_idle_median_s"] * 1000
        for side in runs.values()
        for rs in side.values()
        for r in rs
    ]
    print(markdown_table(headers, rows))
    print(f"\nhealth when idle: median {fmt(median(idle), 1)} ms")
    if flooded:
        print()
        keys = list(next(iter(flooded.values())))
        print(
            markdown_table(
                ["", *flooded],
                [
                    [
                        k,
                        *(
                            fmt(f[k], 1) if isinstance(f[k], float) else f[k]
                            for f in flooded.values()
                        ),
                    ]
                    for k in keys
                ],
            )
        )
    path = write_result("gateway_abuse", {"runs": runs, "flood": flooded, "load": os.getloadavg()})
    print(f"\n{path}")


if __name__ == "__main__":
    main()
