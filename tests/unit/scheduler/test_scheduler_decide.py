"""decide(): priorities, quotas, fair share, routing and explanations."""

from __future__ import annotations

import pytest
from sched_helpers import gpu_nodes, job, running, started

from air_sdk.scheduler import (
    JobRequest,
    NodeSpec,
    SchedulerPolicy,
    TenantQuota,
    decide,
)

POLICY = SchedulerPolicy()


def test_a_job_that_fits_starts_on_distinct_nodes_with_its_gpus():
    d = decide([job("a", nodes=2, gpus=4)], gpu_nodes(3), [], POLICY, now=0)
    (p,) = d.placements
    assert len({a.node for a in p.nodes}) == 2
    assert all(len(a.gpus) == 4 for a in p.nodes)
    assert d.explanations == {} and d.positions == {}


def test_gang_is_all_or_nothing_and_says_how_many_nodes_have_room():
    inv = gpu_nodes(4)
    busy = [running("r", ["n0", "n1"], end=100.0)]
    d = decide([job("big", nodes=4, gpus=8)], inv, busy, POLICY, now=0)
    assert d.placements == []
    assert d.explanations["big"].startswith(
        "needs 4 nodes with 8 free GPUs in pool 'default'; 2 have them"
    )
    assert d.positions == {"big": 1}


def test_best_fit_fills_a_partly_used_node_and_keeps_whole_nodes_free():
    inv = gpu_nodes(2)
    d = decide([job("small", gpus=2)], inv, [running("r", ["n1"], gpus=4)], POLICY, now=0)
    assert d.placements[0].nodes[0].node == "n1"
    assert d.placements[0].nodes[0].gpus == (4, 5)  # the GPUs n1 still has free


def test_high_priority_goes_before_older_normal_and_low():
    inv = gpu_nodes(1)
    q = [
        job("low", at=1, priority="low"),
        job("normal", at=2),
        job("high", at=3, priority="high"),
    ]
    d = decide(q, inv, [], POLICY, now=10)
    assert started(d) == ["high"]
    assert d.positions == {"normal": 1, "low": 2}


def test_priority_order_holds_within_one_tenant_and_across_tenants():
    inv = gpu_nodes(1)
    q = [job("a-low", at=1, tenant="a", priority="low"), job("b-normal", at=5, tenant="b")]
    assert started(decide(q, inv, [], POLICY, now=10)) == ["b-normal"]


def test_unknown_priority_is_rejected_with_the_classes():
    with pytest.raises(ValueError, match="low, normal, high"):
        JobRequest("j", 1, 1, priority="urgent")


def test_quota_blocks_a_tenant_at_its_limit_and_does_not_block_others():
    inv = gpu_nodes(4)
    pol = SchedulerPolicy(quotas={"vision": TenantQuota(gpus=8)})
    busy = [running("v1", ["n0"], tenant="vision")]
    q = [job("v2", at=1, tenant="vision"), job("nlp", at=2, tenant="nlp")]
    d = decide(q, inv, busy, pol, now=10)
    assert started(d) == ["nlp"]
    assert d.explanations["v2"] == (
        "over quota: tenant 'vision' uses 8 of its 8 GPUs; this job needs 8 more"
    )
    assert "v2" not in d.positions  # over quota: not in line, blocks nobody


def test_quota_counts_jobs_started_in_the_same_cycle():
    pol = SchedulerPolicy(quotas={"t": TenantQuota(gpus=8)})
    q = [job("a", gpus=4, at=1, tenant="t"), job("b", gpus=4, at=2, tenant="t"),
         job("c", gpus=4, at=3, tenant="t")]  # fmt: skip
    d = decide(q, gpu_nodes(2), [], pol, now=0)
    assert started(d) == ["a", "b"]
    assert "uses 8 of its 8 GPUs" in d.explanations["c"]


def test_a_job_larger_than_its_quota_is_told_it_never_fits_the_quota():
    pol = SchedulerPolicy(quotas={"t": TenantQuota(gpus=8)})
    d = decide([job("huge", nodes=2, tenant="t")], gpu_nodes(2), [], pol, now=0)
    assert "may hold at most 8" in d.explanations["huge"]


def test_slot_quota_limits_cpu_jobs():
    inv = [NodeSpec("c0", 16), NodeSpec("c1", 16)]
    pol = SchedulerPolicy(default_quota=TenantQuota(slots=16))
    q = [JobRequest("a", 1, 8, tenant="t", submitted_at=1),
         JobRequest("b", 1, 8, tenant="t", submitted_at=2),
         JobRequest("c", 1, 8, tenant="t", submitted_at=3)]  # fmt: skip
    d = decide(q, inv, [], pol, now=0)
    assert started(d) == ["a", "b"]
    assert "uses 16 of its 16 slots" in d.explanations["c"]


def test_drf_serves_the_tenant_with_the_smaller_dominant_share_first():
    inv = gpu_nodes(4)
    # "heavy" already holds 3 of 4 nodes; its older job waits behind light's newer one
    busy = [running(f"h{i}", [f"n{i}"], tenant="heavy") for i in range(3)]
    q = [job("heavy-2", at=1, tenant="heavy"), job("light-1", at=2, tenant="light")]
    d = decide(q, inv, busy, POLICY, now=10)
    assert started(d) == ["light-1"]
    assert d.positions == {"heavy-2": 1}


def test_drf_interleaves_tenants_with_many_queued_jobs():
    inv = gpu_nodes(4)
    q = [job(f"a{i}", at=i, tenant="a") for i in range(4)]
    q += [job(f"b{i}", at=10 + i, tenant="b") for i in range(4)]
    d = decide(q, inv, [], POLICY, now=20)
    assert sorted(started(d)) == ["a0", "a1", "b0", "b1"]  # 2 nodes each, not 4 for "a"


def test_fair_share_weights_give_a_heavier_tenant_more():
    inv = gpu_nodes(3)
    pol = SchedulerPolicy(weights={"a": 2.0})
    q = [job(f"a{i}", at=i, tenant="a") for i in range(3)]
    q += [job(f"b{i}", at=10 + i, tenant="b") for i in range(3)]
    d = decide(q, inv, [], pol, now=20)
    assert sorted(started(d)) == ["a0", "a1", "b0"]


def test_fifo_fair_share_keeps_submit_order():
    inv = gpu_nodes(2)
    pol = SchedulerPolicy(fair_share="fifo")
    q = [job(f"a{i}", at=i, tenant="a") for i in range(3)] + [job("b0", at=10, tenant="b")]
    assert started(decide(q, inv, [], pol, now=20)) == ["a0", "a1"]


def test_same_submit_time_keeps_queue_order():
    q = [JobRequest(f"j{i}", 1, 1) for i in range(3)]  # submitted_at all 0
    d = decide(q, [NodeSpec("n0", 1)], [], POLICY, now=0)
    assert started(d) == ["j0"] and d.positions == {"j1": 1, "j2": 2}


def test_positions_count_per_pool():
    inv = gpu_nodes(1, pool="a", prefix="a") + gpu_nodes(1, pool="b", prefix="b")
    busy = [running("ra", ["a0"], pool="a"), running("rb", ["b0"], pool="b")]
    q = [job("a1", at=1, pool="a"), job("b1", at=2, pool="b"), job("a2", at=3, pool="a")]
    d = decide(q, inv, busy, POLICY, now=10)
    assert d.positions == {"a1": 1, "b1": 1, "a2": 2}
    assert d.routes == {"a1": "a", "b1": "b", "a2": "a"}
    assert d.explanations["a2"].startswith("behind 1 job in pool 'a' (first: a1)")


def test_unhealthy_nodes_get_nothing():
    inv = [NodeSpec("n0", 1), NodeSpec("n1", 1, healthy=False)]
    d = decide([JobRequest("a", 2, 1)], inv, [], POLICY, now=0)
    assert d.placements == []
    assert "never fits" in d.explanations["a"]


def test_unknown_pool_and_accelerator_are_explained():
    inv = gpu_nodes(1, pool="gpu", accelerator="a100")
    d = decide(
        [job("p", pool="tpu"), job("acc", pool="any", accelerator="h100")], inv, [], POLICY, 0
    )
    assert d.explanations["p"] == "no pool named 'tpu'; pools: gpu"
    assert d.explanations["acc"] == "no pool has 'h100' nodes; accelerators here: a100"


def test_route_any_job_to_the_pool_where_it_fits_now():
    inv = gpu_nodes(1, pool="east", prefix="e") + gpu_nodes(1, pool="west", prefix="w")
    d = decide([job("j", pool="any")], inv, [running("r", ["e0"], pool="east")], POLICY, 0)
    assert d.placements[0].pool == "west"


def test_route_by_accelerator_only():
    inv = gpu_nodes(1, pool="p1", accelerator="a100", prefix="a") + gpu_nodes(
        1, pool="p2", accelerator="h100", prefix="h"
    )
    d = decide([job("j", pool="any", accelerator="H100")], inv, [], POLICY, now=0)
    assert d.placements[0].pool == "p2"
    d = decide([job("j", pool="any", accelerator="gpu")], inv, [], POLICY, now=0)
    assert len(d.placements) == 1


def test_blocked_any_job_goes_to_the_pool_with_least_demand_ahead_then_reroutes():
    inv = gpu_nodes(2, pool="east", prefix="e") + gpu_nodes(2, pool="west", prefix="w")
    busy = [running(f"r{n}", [n], pool=n[0] == "e" and "east" or "west", end=100.0)
            for n in ("e0", "e1", "w0", "w1")]  # fmt: skip
    q = [job("e-wait", at=1, pool="east"), job("e-wait2", at=2, pool="east"),
         job("w-wait", at=3, pool="west"), job("flex", at=4, pool="any")]  # fmt: skip
    d = decide(q, inv, busy, POLICY, now=10)
    assert d.routes["flex"] == "west"  # 1 job ahead there, 2 in east
    assert d.positions["flex"] == 2
    # capacity appears in east: next cycle the same job starts there
    d2 = decide([j for j in q if j.job_id == "flex"], inv, busy[1:], POLICY, now=20)
    assert d2.placements[0].pool == "east"


def test_multi_node_gang_stays_in_one_region_when_it_can():
    inv = [
        NodeSpec(f"{r}{i}", 8, tuple(range(8)), labels={"region": r})
        for r in "ab"
        for i in range(2)
    ]
    # "a1" is the fullest node, but a 2-node gang needs both nodes of one region
    busy = [running("r", ["a1"], gpus=4), running("s", ["b0"], gpus=2)]
    d = decide([job("g", nodes=2, gpus=4)], inv, busy, POLICY, now=0)
    nodes = sorted(a.node for a in d.placements[0].nodes)
    assert nodes in (["a0", "a1"], ["b0", "b1"])


def test_strict_locality_waits_instead_of_spanning_regions():
    inv = [NodeSpec(f"{r}0", 8, tuple(range(8)), labels={"region": r}) for r in "ab"]
    pol = SchedulerPolicy(locality_strict=True)
    assert decide([job("g", nodes=2)], inv, [], pol, now=0).placements == []
    assert len(decide([job("g", nodes=2)], inv, [], POLICY, now=0).placements) == 1


def test_mixed_accelerator_pool_never_mixes_them_in_one_gang():
    inv = gpu_nodes(1, pool="p", accelerator="a100", prefix="a") + gpu_nodes(
        1, pool="p", accelerator="h100", prefix="h"
    )
    d = decide([job("g", nodes=2, pool="p")], inv, [], POLICY, now=0)
    assert d.placements == []
    assert "never fits" in d.explanations["g"]


def test_decide_does_not_touch_its_inputs():
    inv = gpu_nodes(2)
    busy = [running("r", ["n0"])]
    q = [job("a"), job("b")]
    before = (list(inv), list(busy), list(q))
    decide(q, inv, busy, POLICY, now=0)
    assert (list(inv), list(busy), list(q)) == before


def test_aging_lifts_a_long_waiting_job_one_class_but_not_its_preemption_rights():
    inv = gpu_nodes(1)
    day = 24 * 3600.0
    q = [job("old-low", at=0, priority="low"), job("new-normal", at=day, priority="normal")]
    # after a day of waiting, "low" is ordered as "normal" and is older
    assert started(decide(q, inv, [], POLICY, now=day + 1)) == ["old-low"]
    assert started(decide(q, inv, [], POLICY, now=day - 1)) == ["new-normal"]
    assert started(decide(q, inv, [], SchedulerPolicy(aging_s=None), now=10 * day)) == [
        "new-normal"
    ]
    # aging stops below the classes that may preempt: an aged job never goes ahead of a
    # high one (it would come back ahead of the job that preempted it, over and over)
    q = [job("aged-normal", at=0), job("high", at=3 * day, priority="high")]
    assert started(decide(q, inv, [], POLICY, now=3 * day + 1)) == ["high"]
    # and it does not gain preemption rights
    busy = [running("r", ["n0"], priority="low")]
    assert decide([job("aged", at=0)], inv, busy, POLICY, now=3 * day).preemptions == []
