"""Gateway test helpers (on sys.path through pytest's `pythonpath`): an app over a real
store with the runner not started, two tenants and a token per kind of caller, and the
app's route table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from air_sdk.bundle import pack_directory
from air_sdk.gateway.app import GatewayContext, create_app
from air_sdk.gateway.options import RequestLimits, SecurityOptions
from air_sdk.runner import LocalBackend, Runner
from air_sdk.scheduler import NodeSpec
from air_sdk.schema import JobState, NodeAssignment, Placement
from air_sdk.store import SqliteStore

#: rate limits off: these tests make hundreds of requests in a second on purpose
NO_RATE_LIMITS = RequestLimits(user_rate=None, worker_rate=None, anonymous_rate=None)
BASE_URL = "http://127.0.0.1"


@dataclass
class Tenancy:
    """Tenant "acme" (owner, viewer, admin), tenant "globex" (other), the system
    tenant's admin (sysadmin) and its Prometheus scraper (metrics); `tokens` maps each
    caller to its bearer token."""

    app: FastAPI
    store: SqliteStore
    home: Path
    tokens: dict[str, str]

    def client(self, who: str | None = None, **headers: str) -> TestClient:
        """A client for caller `who` (None: anonymous)."""
        client = TestClient(self.app, base_url=BASE_URL)
        if who is not None:
            client.headers["Authorization"] = f"Bearer {self.tokens[who]}"
        client.headers.update(headers)
        return client

    def upload(self, who: str, files: dict[str, str] | None = None) -> tuple[str, bytes]:
        src = self.home / f"src-{who}-{len(files or {})}"
        src.mkdir(exist_ok=True)
        for name, text in (files or {"train.py": "print('hi')\n"}).items():
            (src / name).write_text(text)
        bundle = pack_directory(src)
        r = self.client(who).put(f"/v1/bundles/{bundle.sha256}", content=bundle.data)
        assert r.status_code in (200, 201), r.text
        return bundle.sha256, bundle.data

    def submit(self, who: str, **spec: object) -> dict:
        sha, _ = self.upload(who)
        body = {"entrypoint": "train.py", "bundle_sha256": sha, **spec}
        r = self.client(who).post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def start(self, job_id: str) -> tuple[int, str]:
        """Move a queued job to STARTING as the runner would: (attempt, worker token)."""
        self.store.transition(job_id, JobState.SCHEDULED, "placed")
        attempt, token = self.store.start_attempt(
            job_id, Placement(job_id=job_id, nodes=(NodeAssignment(node="node-0", slots=1),))
        )
        self.store.transition(job_id, JobState.STARTING, "launched")
        return attempt, token


def make_app(home: Path, security: SecurityOptions | None = None) -> tuple[FastAPI, SqliteStore]:
    store = SqliteStore(home / "air.db")
    backend = LocalBackend(nodes=[NodeSpec("node-0", 1), NodeSpec("node-1", 1)])
    runner = Runner(store, backend, home, "http://127.0.0.1:1")
    ctx = GatewayContext(store=store, runner=runner, home=home)
    app = create_app(ctx, start_runner=False, security=security)
    return app, store


def app_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves, included routers flattened."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before included routers were resolved lazily
        entries: list[Any] = list(app.routes)
    else:
        entries = list(iter_route_contexts(app.routes))
    routes = set()
    for route in entries:
        assert route.methods and route.path, f"a route without methods or path: {route!r}"
        for method in route.methods:
            routes.add((method, route.path))
    return routes


def tenancy_for(home: Path) -> Tenancy:
    app, store = make_app(home, SecurityOptions(limits=NO_RATE_LIMITS))
    store.create_tenant("acme")
    store.create_tenant("globex")
    tokens = {
        "owner": store.create_token("acme", "member", "owner"),
        "viewer": store.create_token("acme", "viewer", "viewer"),
        "admin": store.create_token("acme", "admin", "acme admin"),
        "other": store.create_token("globex", "member", "other"),
        "sysadmin": store.create_token("default", "admin", "system admin"),
        "metrics": store.create_token("default", "metrics", "prometheus"),
    }
    return Tenancy(app=app, store=store, home=home, tokens=tokens)
