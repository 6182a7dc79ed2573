from air_sdk.scheduler import JobRequest, NodeSpec, fits_ever, free_capacity, place, schedule_fifo
from air_sdk.schema import NodeAssignment, Placement


def inv(*slots: int, gpus_per_node: int = 0) -> list[NodeSpec]:
    return [
        NodeSpec(f"n{i}", s, tuple(range(i * gpus_per_node, (i + 1) * gpus_per_node)))
        for i, s in enumerate(slots)
    ]


def test_gang_gets_distinct_nodes_or_nothing():
    nodes = inv(1, 1)
    p = place(JobRequest("a", nodes=2, slots_per_node=1), nodes, free_capacity(nodes, []))
    assert p is not None and sorted(a.node for a in p.nodes) == ["n0", "n1"]
    # 3 nodes asked of a 2-node cluster: nothing, not a partial placement
    assert (
        place(JobRequest("b", nodes=3, slots_per_node=1), nodes, free_capacity(nodes, [])) is None
    )


def test_two_jobs_that_do_not_fit_together_run_one_after_the_other():
    nodes = inv(1, 1)
    queue = [JobRequest("first", 2, 1), JobRequest("second", 2, 1)]
    started = schedule_fifo(queue, nodes, [])
    assert [p.job_id for p in started] == ["first"]
    # while the first holds its nodes, the second waits
    assert schedule_fifo(queue[1:], nodes, started) == []
    # once the first ends, the second starts
    assert [p.job_id for p in schedule_fifo(queue[1:], nodes, [])] == ["second"]


def test_fifo_head_blocks_smaller_jobs_behind_it():
    nodes = inv(2, 2)
    held = [Placement(job_id="big-running", nodes=(NodeAssignment(node="n0", slots=2),))]
    queue = [JobRequest("needs-two-nodes", 2, 2), JobRequest("small", 1, 1)]
    assert schedule_fifo(queue, nodes, held) == []


def test_best_fit_leaves_whole_nodes_free():
    nodes = inv(4, 4)
    held = [Placement(job_id="x", nodes=(NodeAssignment(node="n1", slots=2),))]
    p = place(JobRequest("small", 1, 2), nodes, free_capacity(nodes, held))
    assert p is not None and p.nodes[0].node == "n1"


def test_gpus_are_assigned_without_overlap():
    nodes = inv(2, 2, gpus_per_node=2)
    started = schedule_fifo(
        [JobRequest("a", 2, 1, gpus_per_node=1), JobRequest("b", 2, 1, gpus_per_node=1)], nodes, []
    )
    assert len(started) == 2
    used = [(a.node, g) for p in started for a in p.nodes for g in a.gpus]
    assert len(used) == len(set(used)) == 4


def test_unhealthy_nodes_get_nothing():
    nodes = [NodeSpec("n0", 1), NodeSpec("n1", 1, healthy=False)]
    assert schedule_fifo([JobRequest("a", 2, 1)], nodes, []) == []


def test_fits_ever_explains_what_to_change():
    reason = fits_ever(JobRequest("a", nodes=3, slots_per_node=1), inv(1, 1))
    assert reason is not None and "lower --nodes" in reason
    assert "no pool named 'gpu'" in (fits_ever(JobRequest("a", 1, 1, pool="gpu"), inv(1)) or "")
    assert fits_ever(JobRequest("a", 2, 1), inv(1, 1)) is None
