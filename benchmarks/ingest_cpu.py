"""CPU time per worker report inside the gateway, without HTTP: the gateway app's own
ASGI callable is called with the bodies `ingest.py` posts (msgpack, columnar points)
and a real worker token of a running job, in this process, and `time.process_time()`
is read around each round. Less noisy than `ingest.py` on a shared machine (no clients,
no sockets), so it compares two versions of the code: run it on each checkout,
interleaved, and compare the medians.

    .venv/bin/python benchmarks/ingest_cpu.py --rounds 5 --reports 1500
    .venv/bin/python benchmarks/ingest_cpu.py --together 4  # 4 reports at a time: one commit
    .venv/bin/python benchmarks/ingest_cpu.py --pages 50   # WAL pages a report's commit writes, by b-tree

It measures only what the app does per report (guards, token check, parsing, checks,
the SQLite transaction); the HTTP server's share is the floor in `ingest.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gatewaytest import Tenancy, make_app  # noqa: E402
from ingest import BENCH_LIMITS, make_bodies  # noqa: E402

from air_sdk.gateway.options import SecurityOptions  # noqa: E402
from air_sdk.schema import JobState  # noqa: E402


class Poster:
    """POSTs report bodies to the app's ASGI callable, as uvicorn would."""

    def __init__(self, num_points: int) -> None:
        home = Path(tempfile.mkdtemp(prefix="air-bench-ingest-cpu-"))
        self.app, self.store = make_app(home, SecurityOptions(limits=BENCH_LIMITS))
        self.store.create_tenant("acme")
        owner = self.store.create_token("acme", "member", "owner")
        tenancy = Tenancy(app=self.app, store=self.store, home=home, tokens={"owner": owner})
        job = tenancy.submit("owner", name="bench")
        attempt, token = tenancy.start(job["id"])
        self.store.transition(job["id"], JobState.RUNNING, "running")
        self.bodies = make_bodies(num_points, 0, "msgpack")
        self.path = f"/v1/jobs/{job['id']}/attempts/{attempt}/report"
        self.headers = [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/msgpack"),
            (b"authorization", f"Bearer {token}".encode()),
        ]

    async def post(self, body: bytes) -> int:
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [*self.headers, (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 5555),
            "server": ("127.0.0.1", 8000),
        }
        sent = False
        status: list[int] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:  # nothing more comes; the app never asks
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await self.app(scope, receive, send)
        return status[0]

    async def post_many(self, count: int, together: int = 1) -> None:
        """`count` reports, `together` at a time (as that many ranks posting at once)."""
        for i in range(0, count, together):
            statuses = await asyncio.gather(
                *(
                    self.post(self.bodies[k % len(self.bodies)])
                    for k in range(i, min(count, i + together))
                )
            )
            if set(statuses) != {204}:
                raise SystemExit(f"the gateway answered {sorted(set(statuses))}")


def cpu_per_report(poster: Poster, rounds: int, reports: int, together: int = 1) -> list[float]:
    async def run() -> list[float]:
        await poster.post_many(200)  # warm: statement cache, verdicts, imports
        per = []
        for _ in range(rounds):
            began = time.process_time()
            await poster.post_many(reports, together)
            per.append((time.process_time() - began) / reports * 1e6)
        return per

    return asyncio.run(run())


def pages_per_report(poster: Poster, reports: int) -> dict[str, float]:
    """The WAL frames `reports` commits write, by the b-tree each page belongs to."""
    db = poster.store._db
    db._writer.execute("PRAGMA wal_autocheckpoint=0")
    asyncio.run(poster.post_many(300))
    db._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    asyncio.run(poster.post_many(reports))
    raw = Path(db.path + "-wal").read_bytes()
    page_size = struct.unpack(">I", raw[8:12])[0]
    conn = sqlite3.connect(db.path)
    owner = {
        pageno: (name, kind)
        for name, pageno, kind in conn.execute("SELECT name, pageno, pagetype FROM dbstat")
    }
    counts: collections.Counter[str] = collections.Counter()
    for offset in range(32, len(raw) - page_size - 23, page_size + 24):
        (pageno,) = struct.unpack(">I", raw[offset : offset + 4])
        name, kind = owner.get(pageno, ("?", ""))
        counts[f"{name} ({kind})" if kind else name] += 1
    return {k: v / reports for k, v in counts.most_common()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reports", type=int, default=1500, help="reports per round")
    p.add_argument("--points", type=int, default=100, help="points per report")
    p.add_argument(
        "--together",
        type=int,
        default=1,
        help="reports posted at once (the gateway commits those that arrive together as one)",
    )
    p.add_argument("--pages", type=int, default=0, help="count WAL pages of this many reports")
    args = p.parse_args(argv)
    poster = Poster(args.points)
    if args.pages:
        for name, per in pages_per_report(poster, args.pages).items():
            print(f"{per:5.2f} pages a report  {name}")
        return
    per = cpu_per_report(poster, args.rounds, args.reports, args.together)
    print(
        f"CPU per {args.points}-point report: median {statistics.median(per):.0f} us,"
        f" min {min(per):.0f} us (rounds: {', '.join(f'{x:.0f}' for x in per)})"
    )


if __name__ == "__main__":
    main()
