"""Metrics ingest: points per second the real gateway accepts from batched worker posts.

How: start a real gateway (subprocess, temp home) and submit a 1-rank job whose
script writes its attempt's env (AIR_JOB_ID, AIR_ATTEMPT, AIR_GATEWAY_URL,
AIR_JOB_TOKEN) to a 0600 file and then sleeps. With that worker token, K client
processes, as K ranks of the job (or, with `--job-per-client`, each with a job of its
own), POST `WorkerReport` bodies, byte for byte what the runtime's shipper sends (B
points of 3 values each; msgpack with columnar points, its default, and with
`--formats msgpack,json` also its JSON), to `/v1/jobs/{id}/attempts/{n}/report` for
`--duration` seconds, so every post goes through the gateway's token check,
validation and SQLite transaction. The ranks of a job share its worker token, whose
rate limit (2,000 reports/s by default) would be measured instead of the gateway, so
the benchmark's gateway has it raised. In the
same run, interleaved, the same clients post the JSON bodies to a peer: a minimal
FastAPI + uvicorn app (started from this file) that parses the JSON and appends one
SQLite row per point.

Clients keep one HTTP/1.1 connection each and time each request. By default they
send requests written out beforehand on a plain socket and read each answer's status
line, headers and body (`--client raw`): less than half of `http.client`'s CPU a
request (90-110 us against 240-250 us here, kernel time included, posting to the
floor; `--client http.client`, what runs before 2026-12-03 used), so more of the 2
cores is left to the servers, as it would be with ranks on other machines.

    .venv/bin/python benchmarks/ingest.py --runs 2 --duration 6
    .venv/bin/python benchmarks/ingest.py --profile      # adds a py-spy profile of the gateway
"""

from __future__ import annotations

import argparse
import array
import collections
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

# At module level: FastAPI resolves the peer's string annotations from these globals.
from fastapi import FastAPI, Request, Response

from air_sdk.gateway_config import RateLimit, RequestLimits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    air_gateway,
    bench_dir,
    fmt,
    free_port,
    header,
    markdown_table,
    median,
    percentile,
    write_result,
)

GOAL_POINTS_PER_S = 300_000
GOAL_P99_MS = 20.0
NUM_DISTINCT_BODIES = 16

SLEEPER = '''\
"""Holds an attempt open and hands its worker env to the benchmark."""
import json, os, sys, time
import air_sdk.runtime as air

air.heartbeat(0)
air.flush(10)
keys = ("AIR_JOB_ID", "AIR_ATTEMPT", "AIR_GATEWAY_URL", "AIR_JOB_TOKEN")
path = sys.argv[1]
fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    json.dump({k: os.environ[k] for k in keys}, f)
os.replace(path + ".tmp", path)
time.sleep(3600)
'''

#: The ranks of a job share its worker token, whose rate limit (2,000 reports/s by
#: default, `RequestLimits.worker_rate`) would be measured instead of the gateway (a
#: shipper over it sends fewer, larger reports): raised here, still checked per report.
BENCH_LIMITS = RequestLimits(worker_rate=RateLimit(per_s=100_000, burst=200_000))


# ---- the peer: a minimal FastAPI + uvicorn endpoint appending to SQLite --------------------


def serve_peer(port: int, db: str) -> None:
    import sqlite3
    import threading

    import uvicorn

    conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS points (rank INTEGER, step INTEGER, ts REAL, v TEXT NOT NULL)"
    )
    lock = threading.Lock()
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/ingest", status_code=204, response_class=Response)
    async def ingest(request: Request) -> Response:
        body = json.loads(await request.body())
        rank = int(body["rank"])
        rows = [(rank, p["step"], p["ts"], json.dumps(p["values"])) for p in body["points"]]
        with lock:
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO points VALUES (?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
        return Response(status_code=204)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_floor(port: int) -> None:
    """What the HTTP stack alone costs: uvicorn and one ASGI function that reads the body
    and answers 204 (200 to the health check), no framework, no storage."""
    import uvicorn

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        status = 200 if scope["method"] == "GET" else 204
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start_peer(db: str, *, floor: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    role = ["--serve-floor", str(port)] if floor else ["--serve-peer", str(port), "--peer-db", db]
    proc = subprocess.Popen(
        [sys.executable, __file__, *role],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the peer server did not start")


# ---- clients --------------------------------------------------------------------------------


#: the Content-Type of each body format
CONTENT_TYPES = {"json": "application/json", "msgpack": "application/msgpack"}


def make_bodies(num_points: int, rank: int, body_format: str = "json") -> list[bytes]:
    """WorkerReport bodies as the runtime's shipper serializes them: compact JSON, or
    msgpack with the points as columns (`_Batch.to_msgpack`, what it sends by default)."""
    if body_format == "msgpack":
        from air_sdk.runtime._shipper import _Batch

        step, now, out = 0, time.time(), []
        for _ in range(NUM_DISTINCT_BODIES):
            points = []
            for _ in range(num_points):
                step += 1
                x = 1.0 / (step + 1)
                points.append((step, now + step * 1e-3, {"loss": x, "acc": 1 - x, "lr": 3e-4}))
            batch = _Batch(points, [], heartbeat_step=step)
            out.append(batch.to_msgpack(rank))
        return out
    bodies = []
    step = 0
    now = time.time()
    for _ in range(NUM_DISTINCT_BODIES):
        points = []
        for _ in range(num_points):
            step += 1
            x = 1.0 / (step + 1)
            points.append(
                {
                    "step": step,
                    "ts": now + step * 1e-3,
                    "values": {"loss": x, "acc": 1 - x, "lr": 3e-4},
                }
            )
        body = {"rank": rank, "heartbeat_step": step, "points": points}
        bodies.append(json.dumps(body, separators=(",", ":")).encode())
    return bodies


def client_task(
    port: int,
    path: str,
    token: str | None,
    num_points: int,
    rank: int,
    start_at: float,
    duration: float,
    body_format: str = "json",
    client: str = "raw",
) -> dict[str, Any]:
    """Post the shipper's bodies to `path` from `start_at` for `duration` seconds, one
    request at a time, timing each: over `_RawConnection` (each request's bytes written
    once before the clock starts) or `http.client`, with the same bodies and headers."""
    bodies = make_bodies(num_points, rank, body_format)
    headers = {"Content-Type": CONTENT_TYPES[body_format]}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if client == "raw":
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept-Encoding: identity\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        requests = [f"{head}Content-Length: {len(b)}\r\n\r\n".encode() + b for b in bodies]
        raw = _RawConnection(port)

        def post(k: int) -> int:
            return raw.request(requests[k % NUM_DISTINCT_BODIES])

        close, errors = raw.close, (OSError, ValueError, IndexError, http.client.HTTPException)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        def post(k: int) -> int:
            conn.request("POST", path, bodies[k % NUM_DISTINCT_BODIES], headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status

        close, errors = conn.close, (OSError, http.client.HTTPException)
    lat = array.array("q")
    statuses: collections.Counter[int] = collections.Counter()
    while time.time() < start_at:
        time.sleep(0.001)
    clock = time.perf_counter_ns
    first = time.time()
    end = first + duration
    k = 0
    while time.time() < end:
        t = clock()
        try:
            status = post(k)
        except errors:
            status = 0
            close()  # both connect again on the next request
        k += 1
        lat.append(clock() - t)
        statuses[status] += 1
    last = time.time()
    close()
    return {"lat_ns": lat.tobytes(), "statuses": dict(statuses), "first": first, "last": last}


class _RawConnection:
    """One keep-alive HTTP/1.1 connection that sends requests written out beforehand and
    reads each answer's status line, headers and body (Content-Length, or none for a
    204): what `http.client` does for these posts, at a fraction of its CPU."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.buf = b""

    def request(self, raw: bytes) -> int:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""
        self.sock.sendall(raw)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        head, self.buf = self.buf[:end], self.buf[end + 4 :]
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"transfer-encoding":
                raise http.client.HTTPException("chunked answers are not read here")
        while len(self.buf) < length:
            self._more()
        self.buf = self.buf[length:]
        return status

    def _more(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise http.client.HTTPException("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def measure(
    pool: ProcessPoolExecutor,
    port: int,
    path: str | list[str],
    token: str | None | list[str],
    num_points: int,
    num_clients: int,
    duration: float,
    ok_status: int = 204,
    body_format: str = "json",
    client: str = "raw",
) -> dict[str, Any]:
    """Post from `num_clients` processes at once; with lists of paths and tokens, client
    i posts to the i-th (its own job)."""
    paths = path if isinstance(path, list) else [path] * num_clients
    tokens = token if isinstance(token, list) else [token] * num_clients
    start_at = time.time() + 0.5
    futures = [
        pool.submit(
            client_task,
            port,
            paths[i],
            tokens[i],
            num_points,
            i,
            start_at,
            duration,
            body_format,
            client,
        )
        for i in range(num_clients)
    ]
    results = [f.result() for f in futures]
    lat_ms: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()
    for r in results:
        a = array.array("q")
        a.frombytes(r["lat_ns"])
        lat_ms += [v / 1e6 for v in a]
        statuses.update({int(k): v for k, v in r["statuses"].items()})
    elapsed = max(r["last"] for r in results) - min(r["first"] for r in results)
    ok = statuses.get(ok_status, 0)
    return {
        "points_per_s": ok * num_points / elapsed,
        "requests_per_s": ok / elapsed,
        "p50_ms": percentile(lat_ms, 50),
        "p99_ms": percentile(lat_ms, 99),
        "max_ms": max(lat_ms) if lat_ms else float("nan"),
        "requests": sum(statuses.values()),
        "errors": {str(k): v for k, v in statuses.items() if k != ok_status},
        "elapsed_s": elapsed,
    }


# ---- profiling ------------------------------------------------------------------------------


#: (category, markers): a sample goes to the category of the innermost frame that holds a marker
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "runner: controller re-reads the job's event log (rank exits)",
        ("JobController._rank_exits",),
    ),
    ("runner: psutil process-tree scan", ("LocalBackend._remember_tree", "job_processes")),
    (
        "runner: other controller/scheduler work",
        ("JobController.step", "Runner._loop", "Runner._run_controller"),
    ),
    ("store: append transaction (INSERTs + COMMIT)", ("EventLog.append_worker_events",)),
    ("store: worker token check (SELECT)", ("AttemptStore.check_worker_token",)),
    ("pydantic: WorkerReport.model_validate_json", ("BaseModel.model_validate_json",)),
    (
        "report body: msgpack decode, columns check, metrics JSON",
        ("report_body.py", "columns.py"),
    ),
    (
        "report writer: queue, savepoints, group COMMIT",
        ("report_writer.py", "Database.batch", "Database._savepoint"),
    ),
    ("report service: scrub, payloads (prepare/store_report)", ("prepare_report", "store_report")),
    ("pydantic: model_dump_json of points/lines", ("BaseModel.model_dump_json",)),
    (
        "threadpool hand-off (run_in_threadpool, loop wake-ups)",
        (
            "run_in_threadpool",
            "WorkerThread.run",
            "call_soon_threadsafe",
            "_write_to_self",
            "_read_from_self",
            "anyio/",
            "to_thread",
        ),
    ),
    (
        "FastAPI/Starlette routing, AIR's middlewares, request body",
        (
            "fastapi/",
            "starlette/",
            "routing.py",
            "worker_report",
            "security.py",
            "report_shortcut.py",
        ),
    ),
    (
        "uvicorn HTTP parsing/writing (h11 or httptools), event loop (asyncio or uvloop)",
        ("uvicorn/", "h11", "httptools", "asyncio/", "selector_events", "uvloop"),
    ),
)


def _category(frames: list[str]) -> str:
    for f in reversed(frames):
        for name, markers in CATEGORIES:
            if any(m in f for m in markers):
                return name
    return "other"


_IDLE_LEAVES = ("Condition.wait", "EpollSelector.select", "Event.wait", "sleep", "select.poll")


def summarize_pyspy(raw: Path, top: int = 25) -> dict[str, Any]:
    """Where the gateway's busy samples go, from py-spy's raw (collapsed) output.

    Samples whose innermost frame is a wait (a parked thread) are left out; each
    other sample goes to the `CATEGORIES` entry of its innermost frame that has a
    marker, and is also counted by innermost function.
    """
    categories: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        raw_frames = stack.split(";")
        if any(m in raw_frames[-1] for m in _IDLE_LEAVES):
            idle += n
            continue
        busy += n
        leaf[_frame(raw_frames[-1])] += n
        categories[_category(raw_frames)] += n
    share = (lambda n: 100.0 * n / busy) if busy else (lambda n: 0.0)
    return {
        "busy_samples": busy,
        "idle_samples": idle,
        "categories": [(c, share(n)) for c, n in categories.most_common()],
        "self": [(f, share(n)) for f, n in leaf.most_common(top)],
    }


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frame(raw: str) -> str:
    """'handle (/x/y/routes.py:123)' -> 'handle (routes.py)': lines merged per function."""
    m = _FRAME.match(raw.strip())
    if not m:
        return raw.strip()
    return f"{m['func']} ({m['file'].rsplit('/', 1)[-1]})"


def py_spy_path() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


# ---- main -----------------------------------------------------------------------------------


class Sleepers:
    """Fresh 1-rank sleeper jobs, one per client of each AIR measurement.

    A fresh job per measurement keeps one measurement's points from slowing the
    next: the job's controller re-reads the job's event log every tick (see
    docs/benchmarks.md), so its cost grows with every point already ingested.
    """

    def __init__(self, client: Any, gateway_url: str, tmp: Path) -> None:
        self.client = client
        self.port = int(gateway_url.rsplit(":", 1)[1])
        self.tmp = tmp
        self.code_dir = bench_dir("air-bench-ingest-code-")
        (self.code_dir / "sleeper.py").write_text(SLEEPER)
        self.num_started = 0

    def start(self) -> tuple[Any, tuple[int, str, str]]:
        self.num_started += 1
        env_file = self.tmp / f"worker-env-{self.num_started}.json"
        job = self.client.submit_script(
            self.code_dir / "sleeper.py",
            args=[str(env_file)],
            name="bench-ingest",
            workdir=self.code_dir,
        )
        deadline = time.monotonic() + 120
        while not env_file.exists():
            if time.monotonic() > deadline or job.status().terminal:
                raise SystemExit(f"the sleeper job did not start: {job.record()}")
            time.sleep(0.05)
        env = json.loads(env_file.read_text())
        path = f"/v1/jobs/{env['AIR_JOB_ID']}/attempts/{env['AIR_ATTEMPT']}/report"
        time.sleep(0.5)  # let the job's start-up work (imports, RUNNING) settle
        return job, (self.port, path, env["AIR_JOB_TOKEN"])

    def stop(self, job: Any) -> None:
        job.cancel()
        job.wait(timeout=60, poll_s=0.1)

    def close(self) -> None:
        shutil.rmtree(self.code_dir, ignore_errors=True)


def history_check(sizes: tuple[int, ...] = (100_000, 1_000_000, 3_000_000)) -> list[dict[str, Any]]:
    """What the job controller's per-tick rank-exit lookup costs as a job's log grows.

    Uses the real `SqliteStore` on a temporary file: appends 100-point metrics events
    as the report route does, then times `read_events(types=(RANK_EXIT,), attempt=n)`,
    the query `JobController._rank_exits` runs every runner tick (0.1 s).
    """
    from air_sdk.schema import EventType, JobSpec, MetricPoint, MetricsBatch, Placement
    from air_sdk.store import SqliteStore

    tmp = Path(tempfile.mkdtemp(prefix="air-bench-history-"))
    out = []
    try:
        store = SqliteStore(tmp / "air.db")
        job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant="default")
        placement = Placement(job_id=job.id, nodes=({"node": "node-0", "slots": 1},))
        attempt, _token = store.start_attempt(job.id, placement)
        data = MetricsBatch(
            points=[
                MetricPoint(step=i, ts=0.0, values={"loss": 0.1, "acc": 0.9, "lr": 3e-4})
                for i in range(100)
            ]
        )
        num_points = 0
        for size in sizes:
            while num_points < size:
                store.append_worker_events(job.id, attempt, 0, [data] * 100, 1)
                num_points += 100 * 100
            t = time.perf_counter()
            for _ in range(5):
                store.read_events(
                    job.id, types=(EventType.RANK_EXIT,), attempt=attempt, limit=10_000
                )
            read_ms = (time.perf_counter() - t) / 5 * 1000
            out.append(
                {
                    "points": num_points,
                    "rank_exit_read_ms": read_ms,
                    "share_of_tick": read_ms / 100.0,
                }
            )
            print(
                f"history: {num_points:>10,} points in the job: rank-exit lookup {read_ms:.1f} ms"
                f" per 100 ms runner tick",
                flush=True,
            )
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _cpu_s(pid: int) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return float("nan")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="interleaved rounds of every config")
    p.add_argument("--duration", type=float, default=4.0, help="seconds of posting per measurement")
    p.add_argument("--clients", default="2,4", help="client process counts to try")
    p.add_argument("--points", default="100,1000", help="points per report to try")
    p.add_argument(
        "--formats",
        default="msgpack",
        help="the bodies AIR is posted: msgpack (the shipper's default), json, or both",
    )
    p.add_argument("--profile", action="store_true", help="py-spy the gateway (100 pts, 2 clients)")
    p.add_argument(
        "--soak",
        type=float,
        default=0.0,
        help="also post 1000-point reports from 2 clients into ONE job for this many seconds,"
        " reporting each 5 s window (shows ingest slowing as the job's log grows)",
    )
    p.add_argument(
        "--history-check",
        action="store_true",
        help="also time the job controller's per-tick event-log lookup at 0.1M-3M points",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also post to uvicorn + a bare ASGI 204 (the HTTP stack's own ceiling)",
    )
    p.add_argument(
        "--client",
        choices=("raw", "http.client"),
        default="raw",
        help="how the client processes post: requests written out beforehand on a plain"
        " socket (raw, the default: least CPU, so more of the cores is left to the servers),"
        " or the standard library's http.client (what runs before 2026-12-03 used)",
    )
    p.add_argument(
        "--job-per-client",
        action="store_true",
        help="each client posts as the rank of a job of its own (default: all of them as"
        " the ranks of one job, as a large job's ranks do)",
    )
    p.add_argument("--serve-peer", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve-floor", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--peer-db", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_peer is not None:
        serve_peer(a.serve_peer, a.peer_db)
        return
    if a.serve_floor is not None:
        serve_floor(a.serve_floor)
        return
    client_counts = [int(x) for x in a.clients.split(",")]
    point_counts = [int(x) for x in a.points.split(",")]
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="air-bench-ingest-"))
    peer, peer_port = start_peer(str(tmp / "peer.db"))
    peer_target = (peer_port, "/ingest", None)
    floor, floor_port = start_peer("", floor=True) if a.floor else (None, 0)
    results: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    profile: dict[str, Any] | None = None
    soak: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    try:
        slots = max(client_counts) if a.job_per_client else 1
        with air_gateway(num_nodes=1, slots_per_node=slots, limits=BENCH_LIMITS) as (
            client,
            gw,
            _home,
        ):
            sleepers = Sleepers(client, gw.url, tmp)
            pool = ProcessPoolExecutor(
                max_workers=max(client_counts), mp_context=get_context("spawn")
            )
            with pool:

                def run(
                    name: str, num_points: int, num_clients: int, duration: float
                ) -> dict[str, Any]:
                    jobs: list[Any] = []
                    body_format = "json"
                    if name.startswith("air"):
                        # the clients are ranks of one job (sharing its worker token), or
                        # each the rank of a job of its own
                        started = [
                            sleepers.start() for _ in range(num_clients if a.job_per_client else 1)
                        ]
                        jobs = [job for job, _ in started]
                        port, _, _ = started[0][1]
                        target = (
                            port,
                            [started[i % len(started)][1][1] for i in range(num_clients)],
                            [started[i % len(started)][1][2] for i in range(num_clients)],
                        )
                        pid = gw.pid
                        body_format = name.split("-", 1)[1]
                    elif name == "floor" and floor is not None:
                        target, pid = (floor_port, "/ingest", None), floor.pid
                    else:
                        target, pid = peer_target, peer.pid
                    cpu0 = _cpu_s(pid)
                    m = measure(
                        pool,
                        *target,
                        num_points,
                        num_clients,
                        duration,
                        body_format=body_format,
                        client=a.client,
                    )
                    m["server_cpu_cores"] = (_cpu_s(pid) - cpu0) / m["elapsed_s"]
                    m["load_1m"] = os.getloadavg()[0]
                    for job in jobs:
                        sleepers.stop(job)
                    return m

                # Warm both servers and spawn every client process.
                targets = [f"air-{f}" for f in a.formats.split(",")] + ["peer"]
                targets += ["floor"] if a.floor else []
                for name in targets:
                    run(name, 100, max(client_counts), 1.0)
                for r in range(a.runs):
                    for num_points in point_counts:
                        for num_clients in client_counts:
                            order = targets if r % 2 == 0 else targets[::-1]
                            for name in order:
                                m = run(name, num_points, num_clients, a.duration)
                                m.update(
                                    target=name, points=num_points, clients=num_clients, run=r + 1
                                )
                                results[f"{name}/{num_points}/{num_clients}"].append(m)
                                print(
                                    f"run {r + 1} {name:<12} {num_points:>5} pts x {num_clients} clients:"
                                    f" {m['points_per_s']:>9,.0f} points/s, p50 {m['p50_ms']:.1f} ms,"
                                    f" p99 {m['p99_ms']:.1f} ms, server CPU {m['server_cpu_cores']:.2f}"
                                    f" cores, load {m['load_1m']:.1f}, errors {m['errors'] or 0}",
                                    flush=True,
                                )
                if a.profile:
                    job, target = sleepers.start()
                    profile = run_profile(pool, gw.pid, target, a.duration)
                    sleepers.stop(job)
                if a.soak > 0:
                    soak = run_soak(pool, sleepers, gw.pid, a.soak)
            sleepers.close()
        if a.history_check:
            history = history_check()
    finally:
        if floor is not None:
            floor.terminate()
            floor.wait(10)
        peer.terminate()
        try:
            peer.wait(10)
        except subprocess.TimeoutExpired:
            peer.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    summary = {}
    rows = []
    for key, ms in results.items():
        name, num_points, num_clients = key.split("/")
        s = {
            "target": name,
            "points": int(num_points),
            "clients": int(num_clients),
            "points_per_s": median([m["points_per_s"] for m in ms]),
            "p50_ms": median([m["p50_ms"] for m in ms]),
            "p99_ms": median([m["p99_ms"] for m in ms]),
            "max_ms": max(m["max_ms"] for m in ms),
            "server_cpu_cores": median([m["server_cpu_cores"] for m in ms]),
            "load_1m": median([m["load_1m"] for m in ms]),
            "errors": sum(sum(m["errors"].values()) for m in ms),
            "each_points_per_s": [m["points_per_s"] for m in ms],
        }
        summary[key] = s
    for num_points in point_counts:
        for num_clients in client_counts:
            peer_s = summary[f"peer/{num_points}/{num_clients}"]
            peer_rate = peer_s["points_per_s"] or float("nan")
            for s in [summary[f"{t}/{num_points}/{num_clients}"] for t in targets]:
                label = (
                    f"AIR gateway, {s['target'].split('-', 1)[1]}"
                    if s["target"].startswith("air")
                    else "floor: uvicorn + a bare ASGI 204"
                    if s["target"] == "floor"
                    else "peer: FastAPI + SQLite"
                )
                rows.append(
                    [
                        label,
                        num_points,
                        num_clients,
                        f"{s['points_per_s']:,.0f}",
                        fmt(s["p50_ms"], 1),
                        fmt(s["p99_ms"], 1),
                        fmt(s["max_ms"], 0),
                        fmt(s["server_cpu_cores"], 2),
                        fmt(s["load_1m"], 1),
                        s["errors"],
                        fmt(s["points_per_s"] / peer_rate) + "x",
                        " / ".join(f"{v / 1000:,.0f}k" for v in s["each_points_per_s"]),
                    ]
                )
    print()
    print(header("Ingest: batched worker reports into the real gateway"))
    print()
    print(
        markdown_table(
            [
                "server",
                "points/report",
                "clients",
                "median points/s",
                "p50 (ms)",
                "p99 (ms)",
                "max (ms)",
                "server CPU (cores)",
                "load (1 min)",
                "errors",
                "vs peer",
                "each run",
            ],
            rows,
        )
    )
    verdicts = []
    for count in client_counts:  # every client count, not only the first: ranks vary
        best = summary.get(f"{targets[0]}/100/{count}")
        if best is not None:
            meets = best["points_per_s"] >= GOAL_POINTS_PER_S and best["p99_ms"] < GOAL_P99_MS
            verdicts.append(
                f"with {count} clients {best['points_per_s']:,.0f} points/s, p99"
                f" {best['p99_ms']:.1f} ms: {'meets' if meets else 'misses'} it"
            )
    if verdicts:
        print()
        print(
            f"Goal (100-point reports): >= {GOAL_POINTS_PER_S:,} points/s with p99 < {GOAL_P99_MS:g} ms."
            f" AIR {'; '.join(verdicts)}."
            f" {a.runs} rounds of {a.duration:g} s per config, a fresh job per AIR measurement,"
            f" {time.perf_counter() - t0:.0f} s in all."
        )
    if soak:
        print()
        print("Soak: 2 clients x 1000-point reports into one job, per 5 s window:")
        print()
        print(
            markdown_table(
                [
                    "window",
                    "points in the job before",
                    "points/s",
                    "p99 (ms)",
                    "gateway CPU (cores)",
                ],
                [
                    [
                        i + 1,
                        f"{w['points_before']:,}",
                        f"{w['points_per_s']:,.0f}",
                        fmt(w["p99_ms"], 1),
                        fmt(w["server_cpu_cores"], 2),
                    ]
                    for i, w in enumerate(soak)
                ],
            )
        )
    if history:
        print()
        print("The job controller's rank-exit lookup (every 0.1 s tick) as the job's log grows:")
        print()
        print(
            markdown_table(
                ["points in the job", "lookup (ms)", "share of one core"],
                [
                    [
                        f"{h['points']:,}",
                        fmt(h["rank_exit_read_ms"], 1),
                        f"{h['share_of_tick']:.0%}",
                    ]
                    for h in history
                ],
            )
        )
    if profile:
        for mode, title in (("threads", "every busy thread"), ("gil", "the GIL holder only")):
            prof = profile[mode]
            print()
            print(
                f"py-spy of the gateway, {title}: {prof['busy_samples']} busy samples"
                f" ({prof['idle_samples']} idle left out), 2 clients x 100-point reports,"
                f" {prof['during_points_per_s']:,.0f} points/s while sampled"
            )
            print()
            print(
                markdown_table(
                    ["where", "share of busy samples"],
                    [[c, f"{v:.1f}%"] for c, v in prof["categories"]],
                )
            )
        print()
        print("innermost functions (every busy thread):")
        for f, v in profile["threads"]["self"][:15]:
            print(f"  {v:5.1f}%  {f}")
    path = write_result(
        "ingest",
        {
            "args": vars(a),
            "goal": {"points_per_s": GOAL_POINTS_PER_S, "p99_ms": GOAL_P99_MS},
            "summary": summary,
            "runs": results,
            "soak": soak,
            "history": history,
            "profile": profile,
        },
    )
    print(f"wrote {path}")


def run_soak(
    pool: ProcessPoolExecutor, sleepers: Sleepers, gateway_pid: int, seconds: float
) -> list[dict[str, Any]]:
    job, target = sleepers.start()
    windows = []
    total = 0
    try:
        for _ in range(max(1, round(seconds / 5))):
            cpu0 = _cpu_s(gateway_pid)
            m = measure(pool, *target, 1000, 2, 5.0, body_format="msgpack")
            m["server_cpu_cores"] = (_cpu_s(gateway_pid) - cpu0) / m["elapsed_s"]
            m["points_before"] = total
            total += int(m["points_per_s"] * m["elapsed_s"])
            windows.append(m)
            print(
                f"soak: {m['points_before']:>10,} points before, {m['points_per_s']:>9,.0f} points/s,"
                f" p99 {m['p99_ms']:.1f} ms, gateway CPU {m['server_cpu_cores']:.2f} cores",
                flush=True,
            )
    finally:
        sleepers.stop(job)
    return windows


def run_profile(
    pool: ProcessPoolExecutor,
    gateway_pid: int,
    target: tuple[int, str, str | None],
    duration: float,
) -> dict[str, Any] | None:
    """py-spy the gateway while 2 clients post 100-point reports: once sampling every busy
    thread, once only the thread holding the GIL (the gateway is one process)."""
    exe = py_spy_path()
    if exe is None:
        print("py-spy is not installed: no profile (`.venv/bin/pip install py-spy`)")
        return None
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    for mode, extra in (("threads", []), ("gil", ["--gil"])):
        raw = RESULTS_DIR / f"ingest-gateway-{mode}.pyspy.txt"
        spy = subprocess.Popen(
            [
                exe,
                "record",
                "-p",
                str(gateway_pid),
                "-d",
                str(int(duration) + 1),
                "-r",
                "200",
                "--format",
                "raw",
                "-o",
                str(raw),
                "--nonblocking",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)
        port, path, token = target
        m = measure(pool, port, path, token, 100, 2, duration, body_format="msgpack")
        _, err = spy.communicate(timeout=60)
        if spy.returncode != 0 or not raw.exists():
            print(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
            return None
        out[mode] = summarize_pyspy(raw)
        out[mode]["during_points_per_s"] = m["points_per_s"]
        out[mode]["raw"] = str(raw)
    return out


if __name__ == "__main__":
    main()
