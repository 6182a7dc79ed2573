"""Per-tenant priority caps, queue caps and foreign job names (issue 19, item 10/11)."""

from __future__ import annotations

import pytest

from air_sdk.scheduler import SchedulerPolicy, parse_cluster_config
from air_sdk.scheduler.tenancy import mask_foreign_jobs, priority_refusal, queue_refusal


def test_members_default_to_normal_and_high_is_refused_naming_the_setting():
    policy = SchedulerPolicy()
    assert priority_refusal(policy, "b", "normal") is None
    assert priority_refusal(policy, "b", "low") is None
    refusal = priority_refusal(policy, "b", "high")
    assert refusal is not None
    assert "max_priority" in refusal and "[tenants.b]" in refusal and "'normal'" in refusal


def test_the_cluster_file_raises_or_lowers_a_tenants_cap():
    cfg = parse_cluster_config(
        '[tenants.vision]\nmax_priority = "high"\n[tenants."*"]\nmax_priority = "low"\n'
    )
    assert priority_refusal(cfg.policy, "vision", "high") is None
    assert priority_refusal(cfg.policy, "nlp", "normal") is not None
    assert priority_refusal(cfg.policy, "nlp", "low") is None


def test_a_bad_max_priority_in_the_cluster_file_says_where():
    with pytest.raises(ValueError, match="tenants.vision.max_priority"):
        parse_cluster_config('[tenants.vision]\nmax_priority = "urgent"\n')


def test_queue_cap_default_and_from_the_cluster_file():
    assert queue_refusal(SchedulerPolicy(), "a", 999) is None
    refusal = queue_refusal(SchedulerPolicy(), "a", 1000)
    assert refusal is not None and "1000" in refusal and "max_queued" in refusal
    cfg = parse_cluster_config("[tenants.a]\nmax_queued = 2\n")
    assert queue_refusal(cfg.policy, "a", 1) is None
    assert queue_refusal(cfg.policy, "a", 2) is not None
    assert queue_refusal(cfg.policy, "b", 2) is None


def test_policy_rejects_nonsense_caps():
    with pytest.raises(ValueError, match="not a priority class"):
        SchedulerPolicy(default_max_priority="top")
    with pytest.raises(ValueError, match="max_queued"):
        SchedulerPolicy(max_queued={"a": 0})


def test_another_tenants_job_is_never_named():
    tenant_of = {"secret-plan-1a2b": "b", "mine-3c4d": "a", "secret-plan-1a2b-x": "b"}
    text = (
        "reserved for job secret-plan-1a2b (backfill): secret-plan-1a2b's start time is"
        " unknown; preempting 2 lower-priority jobs (secret-plan-1a2b-x, mine-3c4d)"
    )
    masked = mask_foreign_jobs(text, "a", tenant_of)
    assert "secret" not in masked
    assert masked.startswith("reserved for another tenant's job (backfill)")
    assert "mine-3c4d" in masked
    # its own tenant sees its own names
    assert mask_foreign_jobs(text, "b", tenant_of).count("secret-plan-1a2b") == 3
