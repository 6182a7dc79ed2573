"""A tenant's restart allowance (`max_restarts_per_hour`): read from the cluster file,
checked, and worded with the setting to change."""

from __future__ import annotations

import pytest

from air_sdk.scheduler.config import parse_cluster_config
from air_sdk.scheduler.policy import SchedulerPolicy
from air_sdk.scheduler.tenancy import TenantCrashes
from air_sdk.schema import FailureInfo, JobSpec, NodeAssignment, Placement
from air_sdk.store import SqliteStore


def test_the_star_entry_is_every_other_tenants_allowance():
    cfg = parse_cluster_config(
        '[tenants."*"]\nmax_restarts_per_hour = 5\n[tenants.acme]\nmax_restarts_per_hour = 0\n'
    )
    assert cfg.policy.restarts_per_hour_for("acme") == 0
    assert cfg.policy.restarts_per_hour_for("globex") == 5
    assert SchedulerPolicy().restarts_per_hour_for("acme") is None  # no cap by default


def test_a_negative_allowance_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="max_restarts_per_hour"):
        parse_cluster_config("[tenants.acme]\nmax_restarts_per_hour = -1\n", source="c.toml")


def test_the_refusal_names_the_count_the_cap_and_the_setting():
    assert TenantCrashes("acme", 3, 3, 0.0).refusal() is None
    why = TenantCrashes("acme", 4, 3, 0.0).refusal()
    assert why is not None
    assert "failed 4 times" in why and "cap of 3" in why and "01:00:00 UTC" in why
    assert "`max_restarts_per_hour` under [tenants.acme]" in why
    assert TenantCrashes("acme", 99, None).refusal() is None


def test_the_store_counts_charged_failures_per_tenant_only():
    store = SqliteStore(":memory:")
    for tenant, charged in (("acme", True), ("acme", True), ("acme", False), ("globex", False)):
        job, _ = store.create_job(JobSpec(entrypoint="t.py"), tenant=tenant)
        placement = Placement(job_id=job.id, nodes=(NodeAssignment(node="n0", slots=1),))
        attempt, _ = store.start_attempt(job.id, placement)
        failure = FailureInfo(attempt=attempt, reason="x", charged=charged)
        store.end_attempt(job.id, attempt, "x", failure)
    counts = store.crashes_by_tenant(0.0)
    assert {t: n for t, (n, _) in counts.items()} == {"acme": 2}
    assert store.crashes_by_tenant(2e12) == {}
