"""place / fits_ever / schedule_fifo with pools, accelerators and pool "any"."""

from __future__ import annotations

from air_sdk.scheduler import JobRequest, NodeSpec, fits_ever, free_capacity, place, schedule_fifo


def _inv() -> list[NodeSpec]:
    return [
        NodeSpec("a0", 8, tuple(range(8)), pool="a100", accelerator="a100"),
        NodeSpec("h0", 8, tuple(range(8)), pool="h100", accelerator="h100"),
        NodeSpec("c0", 16, pool="cpu"),
    ]


def test_place_honours_accelerator_and_any_pool():
    inv = _inv()
    req = JobRequest("j", 1, 8, 8, pool="any", accelerator="h100")
    p = place(req, inv, free_capacity(inv, []))
    assert p is not None and (p.pool, p.nodes[0].node) == ("h100", "h0")
    # a 2-node gang never spans pools, even with pool "any"
    assert place(JobRequest("g", 2, 8, 8, pool="any"), inv, free_capacity(inv, [])) is None


def test_fits_ever_names_missing_accelerators():
    inv = _inv()
    reason = fits_ever(JobRequest("j", 1, 1, 1, pool="any", accelerator="tpu"), inv)
    assert reason == "no pool has 'tpu' nodes; accelerators here: a100, cpu, h100"
    assert fits_ever(JobRequest("j", 1, 1, 1, pool="any", accelerator="gpu"), inv) is None
    reason = fits_ever(JobRequest("j", 1, 1, 1, pool="a100", accelerator="h100"), inv)
    assert reason == "pool 'a100' has no 'h100' nodes; accelerators here: a100"
    assert "lower --nodes" in (fits_ever(JobRequest("g", 2, 8, 8, pool="any"), inv) or "")


def test_fifo_baseline_runs_pool_any_jobs():
    started = schedule_fifo([JobRequest("j", 1, 4, pool="any")], _inv(), [])
    assert [p.job_id for p in started] == ["j"]


def test_node_spec_stays_hashable_with_labels():
    n = NodeSpec("n", 1, labels={"region": "eu"})
    assert hash(n) == hash(NodeSpec("n", 1, labels={"region": "us"}))
    assert n != NodeSpec("n", 1, labels={"region": "us"})
