"""Who may call what: every route of the app x every kind of caller, generated from the
app's route table, so a new route without an expectation here fails the suite.

Callers: the job's owner (member of tenant acme), a member of another tenant, an acme
viewer, an acme admin, an admin of the system tenant, a worker token of the job's
attempt, nobody (no token), and the system tenant's metrics token (Prometheus: it reads
/metrics and nothing else, so 403 wherever a row does not say otherwise).
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any, NamedTuple

import pytest
from gatewaytest import app_routes

from air_sdk.schema import JobState


class Expect(NamedTuple):
    """The status each kind of caller must get from one route."""

    owner: int
    other: int
    viewer: int
    admin: int
    sysadmin: int
    worker: int
    anonymous: int
    metrics: int = 403


CALLERS = Expect._fields

# Shorthands for one row: the status each caller gets, in CALLERS order:
#              owner other viewer admin sysadmin worker anonymous (metrics: 403)
READ_OWN = Expect(200, 404, 200, 200, 404, 401, 401)  # a job or bundle of acme
WRITE_OWN = Expect(200, 404, 403, 200, 404, 401, 401)
ANY_USER = Expect(200, 200, 200, 200, 200, 401, 401)
ADMIN = Expect(403, 403, 403, 200, 200, 401, 401)
SYSTEM_ADMIN = Expect(403, 403, 403, 403, 200, 401, 401)

EXPECTED: dict[tuple[str, str], Expect] = {
    ("GET", "/v1/health"): Expect(200, 200, 200, 200, 200, 200, 200, metrics=200),
    # every tenant's numbers: the scraper's token and the system admin; loopback without
    # a token only where the gateway allows it (the test client's peer is not loopback)
    ("GET", "/metrics"): Expect(403, 403, 403, 403, 200, 401, 401, metrics=200),
    # each tenant's own SLOs, the system admin's all
    ("GET", "/v1/slo"): ANY_USER,
    ("GET", "/v1/openapi.json"): ANY_USER,
    ("GET", "/v1/cluster"): ANY_USER,
    # bundles are per tenant: another tenant has not uploaded this one, and may upload its own
    ("HEAD", "/v1/bundles/{sha256}"): READ_OWN,
    ("PUT", "/v1/bundles/{sha256}"): Expect(201, 201, 403, 201, 201, 401, 401),
    # another tenant's spec names a bundle it never uploaded: 400, as for any unknown bundle
    ("POST", "/v1/jobs"): Expect(201, 400, 403, 201, 400, 401, 401),
    ("GET", "/v1/jobs"): ANY_USER,
    ("GET", "/v1/jobs/{job_id}"): READ_OWN,
    ("POST", "/v1/jobs/{job_id}/cancel"): WRITE_OWN,
    ("GET", "/v1/jobs/{job_id}/attempts"): READ_OWN,
    ("GET", "/v1/jobs/{job_id}/events"): READ_OWN,
    ("GET", "/v1/jobs/{job_id}/events/stream"): READ_OWN,
    ("GET", "/v1/jobs/{job_id}/logs"): READ_OWN,
    ("GET", "/v1/jobs/{job_id}/metrics"): READ_OWN,
    ("GET", "/v1/jobs/{job_id}/checkpoints"): READ_OWN,
    ("GET", "/v1/jobs/{job_id}/outputs"): READ_OWN,
    ("GET", "/v1/jobs/{job_id}/outputs/files/{path:path}"): READ_OWN,
    ("GET", "/v1/ui/jobs/{job_id}"): READ_OWN,
    # the web page's own files hold no data: anyone who reaches the gateway gets them
    ("GET", "/ui"): Expect(200, 200, 200, 200, 200, 200, 200, metrics=200),
    ("GET", "/ui/app.js"): Expect(200, 200, 200, 200, 200, 200, 200, metrics=200),
    ("GET", "/ui/app.css"): Expect(200, 200, 200, 200, 200, 200, 200, metrics=200),
    # only the attempt's worker token may report; a user token is not one (401)
    ("POST", "/v1/jobs/{job_id}/attempts/{attempt}/report"): Expect(
        401, 401, 401, 401, 401, 204, 401, metrics=401
    ),
    ("GET", "/v1/admin/tenants"): ADMIN,
    ("POST", "/v1/admin/tenants"): Expect(403, 403, 403, 403, 201, 401, 401),
    ("GET", "/v1/admin/tokens"): ADMIN,
    ("POST", "/v1/admin/tokens"): Expect(403, 403, 403, 201, 201, 401, 401),
    ("POST", "/v1/admin/tokens/{token_id}/revoke"): ADMIN,
    ("GET", "/v1/admin/nodes"): SYSTEM_ADMIN,
    ("POST", "/v1/admin/nodes/{name}/clear"): SYSTEM_ADMIN,
    # deletes files of every tenant (the matrix asks for a dry run)
    ("POST", "/v1/admin/gc"): SYSTEM_ADMIN,
}


def _fill(template: str, params: dict[str, str]) -> str:
    """The route's path with `params` in it (a `{path:path}` parameter as `{path}`)."""
    return template.replace(":path}", "}").format(**params)


@pytest.fixture
def world(tenancy):
    """An ended acme job with one attempt (so streams end), its bundle and worker token,
    and a spare acme token to revoke."""
    job = tenancy.submit("owner")
    attempt, worker_token = tenancy.start(job["id"])
    tenancy.store.transition(job["id"], JobState.RUNNING, "all ranks up")
    tenancy.store.transition(job["id"], JobState.SUCCEEDED, "done")
    tenancy.tokens["worker"] = worker_token
    sha, data = tenancy.upload("owner")
    spare = tenancy.store.issue_token("acme", "viewer", "spare")[0]
    outputs = tenancy.home / "outputs" / job["id"]
    outputs.mkdir(parents=True)
    (outputs / "result.txt").write_text("42\n")
    counter = itertools.count()
    params = {
        "job_id": job["id"],
        "attempt": str(attempt),
        "sha256": sha,
        "token_id": spare.id,
        "name": "node-0",
        "path": "result.txt",
    }

    def body(method: str, path: str) -> dict[str, Any]:
        if path == "/v1/jobs":
            return {"json": {"entrypoint": "train.py", "bundle_sha256": sha}}
        if path.startswith("/v1/bundles/") and method == "PUT":
            return {"content": data}
        if path == "/v1/admin/tenants" and method == "POST":
            return {"json": {"name": f"tenant-{next(counter)}"}}
        if path == "/v1/admin/tokens" and method == "POST":
            return {"json": {"role": "viewer", "name": "matrix"}}
        if path.endswith("/report"):
            return {"json": {"rank": 0, "lines": ["hello"]}}
        if path == "/v1/admin/gc":
            return {"json": {"dry_run": True}}
        return {}

    return tenancy, params, body


def test_every_route_has_an_expectation(tenancy):
    routes = app_routes(tenancy.app)
    missing = sorted(routes - set(EXPECTED))
    stale = sorted(set(EXPECTED) - routes)
    assert not missing, (
        f"routes without an authorization expectation: add them to EXPECTED: {missing}"
    )
    assert not stale, f"EXPECTED names routes the app no longer has: {stale}"


def test_authorization_matrix(world):
    tenancy, params, body = world
    failures = []
    for method, template in sorted(app_routes(tenancy.app)):
        path = _fill(template, params)
        for caller, expected in zip(CALLERS, EXPECTED[(method, template)], strict=True):
            client = tenancy.client(None if caller == "anonymous" else caller)
            r = client.request(method, path, **body(method, template))
            if r.status_code != expected:
                failures.append(f"{caller:9} {method} {path}: {r.status_code}, expected {expected}")
            if r.status_code >= 400 and method != "HEAD":
                assert "detail" in r.json(), (caller, method, path, r.text)
    assert not failures, "\n" + "\n".join(failures)


def test_a_guessed_token_gets_what_nobody_gets_and_its_body_is_never_read(world):
    """A well-formed but unknown token (the issue-14 probe sent a fresh one each time)
    is treated as no token on every route; a write route does not parse its body (a
    broken one is 401, not 422)."""
    tenancy, params, body = world
    guessed = tenancy.client(Authorization=f"Bearer air_{secrets.token_urlsafe(32)}")
    failures = []
    for method, template in sorted(app_routes(tenancy.app)):
        path = _fill(template, params)
        expected = EXPECTED[(method, template)].anonymous
        r = guessed.request(method, path, **body(method, template))
        if r.status_code != expected:
            failures.append(f"{method} {path}: {r.status_code}, expected {expected}")
        if method in ("POST", "PUT") and expected == 401:
            broken = guessed.request(
                method, path, content=b"{not json", headers={"Content-Type": "application/json"}
            )
            if broken.status_code != 401:
                failures.append(f"{method} {path} with a broken body: {broken.status_code}")
    assert not failures, "\n" + "\n".join(failures)


def test_another_tenants_job_is_not_found_exactly_like_a_missing_one(world):
    tenancy, params, _ = world
    job_id, missing = params["job_id"], "no-such-job-00000000"
    other = tenancy.client("other")
    for template in sorted(p for m, p in EXPECTED if "{job_id}" in p and m == "GET"):
        if "{attempt}" in template:
            continue
        theirs = other.get(_fill(template, {**params, "job_id": job_id}))
        nothing = other.get(_fill(template, {**params, "job_id": missing}))
        assert theirs.status_code == nothing.status_code == 404, template
        assert theirs.json()["detail"].replace(job_id, "X") == nothing.json()["detail"].replace(
            missing, "X"
        )
        assert theirs.headers["content-type"] == nothing.headers["content-type"]


def test_lists_are_filtered_by_tenant(world):
    tenancy, params, _ = world
    mine = {j["id"] for j in tenancy.client("owner").get("/v1/jobs").json()["jobs"]}
    theirs = {j["id"] for j in tenancy.client("other").get("/v1/jobs").json()["jobs"]}
    assert params["job_id"] in mine and params["job_id"] not in theirs
    assert tenancy.client("viewer").get("/v1/jobs").json()["jobs"][0]["tenant"] == "acme"


def test_a_worker_token_reads_nothing_and_reports_only_for_its_own_attempt(world):
    tenancy, params, _ = world
    worker = tenancy.client("worker")
    assert worker.get(f"/v1/jobs/{params['job_id']}").status_code == 401
    other_job = tenancy.submit("owner")
    other_attempt, _ = tenancy.start(other_job["id"])
    r = worker.post(f"/v1/jobs/{other_job['id']}/attempts/{other_attempt}/report", json={"rank": 0})
    assert r.status_code == 401
    r = worker.post(
        f"/v1/jobs/{params['job_id']}/attempts/{int(params['attempt']) + 1}/report",
        json={"rank": 0},
    )
    assert r.status_code == 401  # a real token, but of another attempt number


def test_tenant_admins_manage_only_their_own_tenant(world):
    tenancy, _, _ = world
    admin = tenancy.client("admin")
    assert {t["id"] for t in admin.get("/v1/admin/tenants").json()["tenants"]} == {"acme"}
    assert {t["tenant"] for t in admin.get("/v1/admin/tokens").json()["tokens"]} == {"acme"}
    # another tenant is "not found", like one that does not exist
    for tenant in ("globex", "nope"):
        r = admin.post("/v1/admin/tokens", json={"tenant": tenant, "role": "admin"})
        assert r.status_code == 404 and r.json()["detail"].startswith("no tenant")
        assert admin.get("/v1/admin/tokens", params={"tenant": tenant}).status_code == 404
    globex_token = tenancy.store.list_tokens("globex")[0]
    assert admin.post(f"/v1/admin/tokens/{globex_token.id}/revoke").status_code == 404
    assert tenancy.client("other").get("/v1/jobs").status_code == 200  # still alive
    # the system admin manages every tenant
    sysadmin = tenancy.client("sysadmin")
    assert {"acme", "globex", "default"} <= {
        t["id"] for t in sysadmin.get("/v1/admin/tenants").json()["tenants"]
    }
    r = sysadmin.post("/v1/admin/tokens", json={"tenant": "globex", "role": "viewer"})
    assert r.status_code == 201 and r.json()["info"]["tenant"] == "globex"


def test_a_revoked_token_is_refused_at_once(world):
    tenancy, _, _ = world
    admin = tenancy.client("admin")
    created = admin.post("/v1/admin/tokens", json={"role": "member", "name": "ci"}).json()
    assert created["token"].startswith("air_") and len(created["token"]) >= 4 + 43
    fresh = tenancy.client(Authorization=f"Bearer {created['token']}")
    assert fresh.get("/v1/jobs").status_code == 200
    listed = admin.get("/v1/admin/tokens").json()["tokens"]
    assert created["info"]["id"] in {t["id"] for t in listed}
    assert all("token" not in t for t in listed)  # never the plaintext again
    r = admin.post(f"/v1/admin/tokens/{created['info']['id']}/revoke")
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert fresh.get("/v1/jobs").status_code == 401


def test_clearing_a_node_puts_it_back_in_the_inventory(world):
    import time

    from air_sdk.runner.policy import NodeEvidence

    tenancy, _, _ = world
    book = tenancy.app.state.air.runner.node_book
    for i, tenant in enumerate(["acme", "globex"] * 2 + ["acme"]):  # two tenants' crashes
        tenancy.store.record_node_failure("node-1")
        book.add(NodeEvidence("node-1", "crash", tenant, f"job-{i}", time.time()))
    sysadmin = tenancy.client("sysadmin")
    nodes = {n["name"]: n for n in sysadmin.get("/v1/admin/nodes").json()["nodes"]}
    assert nodes["node-1"]["num_failures"] == 5 and not nodes["node-1"]["healthy"]
    cluster = {n["name"]: n for n in sysadmin.get("/v1/cluster").json()["nodes"]}
    assert not cluster["node-1"]["healthy"] and cluster["node-0"]["healthy"]  # one truth
    r = sysadmin.post("/v1/admin/nodes/node-1/clear")
    assert r.status_code == 200 and r.json()["healthy"] and r.json()["num_failures"] == 0
    assert tenancy.store.node_failures() == {}
    assert all(n["healthy"] for n in sysadmin.get("/v1/cluster").json()["nodes"])
    assert sysadmin.post("/v1/admin/nodes/node-9/clear").status_code == 404
