"""NodeHealthPolicy and node_evidence: a node is bad only on evidence that is not one
job's, nor one tenant's, own doing (issue 19, item 7)."""

from __future__ import annotations

from air_sdk.runner.node_health import NodeHealthBook
from air_sdk.runner.policy import NodeEvidence, NodeHealthPolicy, node_evidence
from air_sdk.schema import FailureInfo, RankExit


def crash(node="n1", tenant="a", job="j1", ts=100.0, kind="crash"):
    return NodeEvidence(node=node, kind=kind, tenant=tenant, job_id=job, ts=ts)


def test_one_tenants_crash_loops_never_take_a_node_on_a_shared_gateway():
    # The attack: max_restarts=5 segfaults, then again with more jobs, all of tenant a.
    evidence = [crash(node=n, job=f"j{i}") for n in ("n0", "n1") for i in range(12)]
    assert NodeHealthPolicy().unhealthy(evidence, now=110.0, num_tenants=2) == set()


def test_one_tenants_device_error_claims_do_not_either():
    evidence = [crash(kind="device", job=f"j{i}") for i in range(5)]
    assert NodeHealthPolicy().unhealthy(evidence, now=110.0, num_tenants=2) == set()


def test_failures_of_two_tenants_jobs_on_a_node_make_it_unhealthy():
    evidence = [crash(tenant="a", job="j1"), crash(tenant="b", job="k1"), crash(node="n2")]
    assert NodeHealthPolicy().unhealthy(evidence, now=110.0, num_tenants=2) == {"n1"}


def test_a_device_error_with_another_tenants_failure_is_enough():
    evidence = [crash(kind="device", tenant="a"), crash(kind="device", tenant="b", job="k")]
    assert NodeHealthPolicy(min_jobs=3).unhealthy(evidence, now=110.0, num_tenants=3) == {"n1"}


def test_a_probe_failure_alone_makes_a_node_unhealthy():
    evidence = [crash(kind="probe", tenant="operator", job="probe")]
    assert NodeHealthPolicy().unhealthy(evidence, now=110.0, num_tenants=5) == {"n1"}


def test_a_single_tenant_gateway_needs_several_jobs_or_a_device_error():
    policy = NodeHealthPolicy()
    assert policy.unhealthy([crash()], now=110.0, num_tenants=1) == set()
    assert policy.unhealthy([crash(), crash(job="j2")], now=110.0, num_tenants=1) == {"n1"}
    assert policy.unhealthy([crash(kind="device")], now=110.0, num_tenants=1) == {"n1"}


def test_evidence_ages_out_after_the_cooldown():
    evidence = [crash(tenant="a"), crash(tenant="b", job="k")]
    policy = NodeHealthPolicy(cooldown_s=300.0)
    assert policy.unhealthy(evidence, now=399.0, num_tenants=2) == {"n1"}
    assert policy.unhealthy(evidence, now=401.0, num_tenants=2) == set()


def failure(**kw):
    kw.setdefault("attempt", 1)
    kw.setdefault("reason", "x")
    kw.setdefault("node", "n1")
    return FailureInfo(**kw)


def test_an_exit_code_is_no_evidence_against_the_node():
    assert node_evidence(failure(kind="crash", exit_code=1), tenant="a", job_id="j", now=1) is None


def test_a_hardware_signal_or_a_lost_launcher_is_crash_evidence():
    seg = node_evidence(failure(kind="crash", signal="SIGSEGV"), tenant="a", job_id="j", now=1)
    lost = node_evidence(failure(kind="lost_node"), tenant="a", job_id="j", now=1)
    assert (seg.kind, seg.node, seg.tenant, seg.job_id) == ("crash", "n1", "a", "j")
    assert lost.kind == "crash"


def test_device_error_text_in_any_rank_tail_is_device_evidence():
    exits = [RankExit(rank=0, exit_code=1, tail=["NCCL error: unhandled cuda error"])]
    for f in (
        failure(kind="crash", exit_code=1, rank_exits=exits),
        failure(kind="crash", exit_code=1, log_tail=["NVRM: Xid (PCI:0000:3b:00): 79"]),
    ):
        assert node_evidence(f, tenant="a", job_id="j", now=1).kind == "device"


def test_a_failure_without_a_node_is_no_evidence():
    f = failure(kind="crash", signal="SIGBUS", node=None)
    assert node_evidence(f, tenant="a", job_id="j", now=1) is None


def test_the_book_forgives_crashes_after_a_success_but_keeps_device_errors():
    book = NodeHealthBook()
    book.add(crash())
    book.add(crash(kind="device", job="j2"))
    book.add(crash(node="n2"))
    book.ran_fine("n1")
    assert sorted((e.node, e.kind) for e in book.evidence()) == [("n1", "device"), ("n2", "crash")]
    book.clear("n1")
    assert [e.node for e in book.evidence()] == ["n2"]


def test_the_book_drops_evidence_older_than_it_keeps():
    book = NodeHealthBook(keep_s=10.0)
    book.add(crash(ts=0.0))
    book.add(crash(ts=20.0, job="j2"))
    assert [e.job_id for e in book.evidence()] == ["j2"]
