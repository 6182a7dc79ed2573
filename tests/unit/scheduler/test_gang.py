from air_sdk.scheduler import (
    MACHINE_CORES_LABEL,
    MACHINE_GPUS_LABEL,
    JobRequest,
    NodeSpec,
    fits_ever,
    free_capacity,
    place,
    schedule_fifo,
)
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


# -- a job that never fits this machine's virtual nodes names the flag that helps ------


def _machine(num_nodes: int, cores: int, gpus: int = 0, slots: int | None = None) -> list[NodeSpec]:
    labels = {MACHINE_CORES_LABEL: str(cores), MACHINE_GPUS_LABEL: str(gpus)}
    per = gpus // num_nodes
    return [
        NodeSpec(
            f"node-{i}",
            slots or per or max(1, cores // num_nodes),
            tuple(range(i * per, (i + 1) * per)),
            labels=labels,
        )
        for i in range(num_nodes)
    ]


def test_too_few_slots_per_node_names_slots_per_node_and_the_cores():
    reason = fits_ever(JobRequest("j", 2, 4), _machine(2, cores=2))
    assert reason == (
        "the job needs 2 nodes with 4 slots each; the gateway's nodes have 1 slot each"
        " (this machine: 2 cores, no GPUs, split into 2 nodes): lower --procs-per-node to 1,"
        " or restart the gateway with --slots-per-node 4 (ranks beyond the cores share them)"
    )
    assert "more nodes" not in reason


def test_too_few_nodes_names_nodes_and_slots_per_node_when_the_cores_would_not_do():
    assert fits_ever(JobRequest("j", 3, 1), _machine(2, cores=4)) == (
        "the job needs 3 nodes with 1 slot each; this gateway places at most 2 nodes x"
        " 2 ranks (this machine: 4 cores, no GPUs, split into 2 nodes): lower --nodes to 2,"
        " or restart the gateway with --nodes 3"
    )
    reason = fits_ever(JobRequest("j", 3, 2), _machine(2, cores=4)) or ""
    assert reason.endswith("restart the gateway with --nodes 3 --slots-per-node 2")


def test_more_nodes_than_cores_says_what_fits_and_never_to_restart_with_them():
    reason = fits_ever(JobRequest("j", 1000, 1), _machine(2, cores=2)) or ""
    assert reason == (
        "the job needs 1000 nodes with 1 slot each; this gateway places at most 2 nodes x"
        " 1 rank (this machine: 2 cores, no GPUs, split into 2 nodes): lower --nodes to 2;"
        " for more nodes, submit to a cluster that has them (air gateway start --cluster"
        " FILE with a larger pool, or --backend ray)"
    )
    assert "--nodes 1000" not in reason


def test_gpus_on_this_machine_say_what_it_has():
    assert fits_ever(JobRequest("j", 2, 2, 2), _machine(4, cores=8, gpus=4)) == (
        "the job needs 2 nodes with 2 slots and 2 GPUs each; the gateway's nodes have 1 GPU"
        " each (this machine: 8 cores, 4 GPUs, split into 4 nodes): restart the gateway with"
        " --nodes 2, so each node gets 2 GPUs, or lower --gpus-per-node"
    )
    assert (fits_ever(JobRequest("j", 1, 1, 1), _machine(2, cores=2)) or "").endswith(
        "this machine has no GPUs (this machine: 2 cores, no GPUs, split into 2 nodes):"
        " give --gpus-per-node 0 (CPU)"
    )


def test_a_real_cluster_is_told_to_add_nodes_not_gateway_flags():
    reason = fits_ever(
        JobRequest("j", 3, 8, 8), [NodeSpec(f"g{i}", 8, tuple(range(8))) for i in range(2)]
    )
    assert reason is not None and "--slots-per-node" not in reason and "restart" not in reason
    assert reason.endswith("or add such nodes to the cluster")
    assert "2 such nodes (2 nodes, at most 8 slots and 8 GPUs each)" in reason
