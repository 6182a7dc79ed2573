"""Submit-time caps of a shared gateway (issue 19): a member's priority above its
tenant's cap, a grace above the operator's, a full queue; and /v1/cluster naming only
the caller's jobs. Through the real app and store (the runner not started)."""

from __future__ import annotations

from gatewaytest import Tenancy

from air_sdk.scheduler import SchedulerPolicy
from air_sdk.schema import NodeAssignment, Placement


def body(tenancy: Tenancy, who: str, **spec: object) -> dict:
    sha, _ = tenancy.upload(who)
    return {"entrypoint": "train.py", "bundle_sha256": sha, **spec}


def test_high_priority_is_refused_to_members_and_allowed_to_the_system_admin(tenancy):
    r = tenancy.client("other").post("/v1/jobs", json=body(tenancy, "other", priority="high"))
    assert r.status_code == 403
    assert "max_priority" in r.json()["detail"] and "[tenants.globex]" in r.json()["detail"]
    assert tenancy.store.list_jobs(tenant="globex") == []
    r = tenancy.client("sysadmin").post("/v1/jobs", json=body(tenancy, "sysadmin", priority="high"))
    assert r.status_code == 201, r.text


def test_a_tenant_whose_cap_allows_high_may_submit_it(tenancy):
    tenancy.app.state.air.runner.policy = SchedulerPolicy(max_priorities={"globex": "high"})
    r = tenancy.client("other").post("/v1/jobs", json=body(tenancy, "other", priority="high"))
    assert r.status_code == 201, r.text


def test_a_grace_above_the_operators_cap_is_refused_with_the_cap(tenancy):
    spec = body(tenancy, "owner", failure={"preemption_grace_s": 3600})
    r = tenancy.client("owner").post("/v1/jobs", json=spec)
    assert r.status_code == 403 and "cap of 120 s" in r.json()["detail"]


def test_a_full_queue_is_refused_saying_so_and_other_tenants_still_submit(tenancy):
    tenancy.app.state.air.runner.policy = SchedulerPolicy(max_queued={"globex": 2})
    other = tenancy.client("other")
    for _ in range(2):
        assert other.post("/v1/jobs", json=body(tenancy, "other")).status_code == 201
    r = other.post("/v1/jobs", json=body(tenancy, "other"))
    assert r.status_code == 409
    assert "2 queued jobs, its cap is 2" in r.json()["detail"]
    assert "max_queued" in r.json()["detail"]
    owner = tenancy.client("owner")
    assert owner.post("/v1/jobs", json=body(tenancy, "owner")).status_code == 201


def test_the_cluster_view_names_only_the_callers_jobs(tenancy, monkeypatch):
    mine = tenancy.submit("owner")["id"]
    theirs = tenancy.submit("other")["id"]
    held = [
        (Placement(job_id=mine, nodes=(NodeAssignment(node="node-0", slots=1),)), "acme"),
        (Placement(job_id=theirs, nodes=(NodeAssignment(node="node-1", slots=1),)), "globex"),
    ]
    monkeypatch.setattr(tenancy.app.state.air.runner, "held_jobs", lambda: held)

    def named(who: str) -> set[str]:
        nodes = tenancy.client(who).get("/v1/cluster").json()["nodes"]
        assert sum(n["used_slots"] for n in nodes) == 2  # use is shown, names are not
        return {j for n in nodes for j in n["jobs"]}

    assert named("owner") == named("viewer") == {mine}
    assert named("other") == {theirs}
    assert named("sysadmin") == {mine, theirs}
