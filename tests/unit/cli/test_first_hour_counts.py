"""A count of 1 reads "1 node", never "1 nodes": every place that says a count with a
noun goes through `air_sdk.text.plural`. Each place is rendered here with a count of 1."""

from __future__ import annotations

import re

import pytest

from air_sdk.notebook.snapshot_html import badge_html, render_html
from air_sdk.runner.machine import MachineCap, oversubscribed_by, oversubscription
from air_sdk.runner.policy import RestartPolicy
from air_sdk.scheduler import MACHINE_CORES_LABEL, JobRequest, NodeSpec, fits_ever
from air_sdk.scheduler.admission import quota_problem
from air_sdk.scheduler.policy import TenantQuota
from air_sdk.schema import FailureInfo, JobSnapshot, JobSpec, NodeAssignment, Placement
from air_sdk.text import plural

#: a count of one with a plural noun, as the issue saw it: "1 nodes", "1 ranks per node"
ONE_PLURAL = re.compile(r"\b1 (nodes|ranks|slots|GPUs|cores|restarts|steps|more ranks)\b")


def said_right(text: str) -> str:
    assert not ONE_PLURAL.search(text), text
    return text


def test_the_scheduler_and_runner_sentences_say_one_in_the_singular():
    one_core = MachineCap(1, frozenset({"node-0"}), 1)
    text = said_right(one_core.never(JobRequest("j", 1, 2)) or "")
    assert (
        "this gateway runs at most 1 rank at once (1 node x 1 rank: this machine's 1 core" in text
    )
    one_gpu = said_right(quota_problem(JobRequest("j", 1, 1, 1), TenantQuota(gpus=0), 0, 0))
    assert one_gpu.startswith("the job needs 1 GPU;")
    one_slot = said_right(quota_problem(JobRequest("j", 1, 1), TenantQuota(slots=1), 0, 1))
    assert "uses 1 of its 1 slot;" in one_slot
    local = [NodeSpec("node-0", 1, labels={MACHINE_CORES_LABEL: "1"})]
    text = said_right(fits_ever(JobRequest("j", 2, 1), local) or "")
    assert "places at most 1 node x 1 rank (this machine: 1 core" in text
    uncapped = [NodeSpec("node-0", 2, labels={MACHINE_CORES_LABEL: "1"})]
    said_right(oversubscription(uncapped, cores=1) or "")
    placement = Placement(job_id="a", nodes=(NodeAssignment(node="node-0", slots=2),))
    said_right(oversubscribed_by(placement, [], uncapped) or "")


def test_the_restart_budget_of_one_reads_in_the_singular():
    failure = FailureInfo(attempt=2, reason="rank 0 exit code 3", exit_code=3)
    decision = RestartPolicy(max_restarts=1).make_decision(failure, num_restarts=1)
    assert "; all 1 restart used: raise --max-restarts" in said_right(decision.reason)


def test_the_monitor_says_one_restart_and_one_more_rank():
    snapshot = JobSnapshot(job_id="j", num_restarts=1, attempt=2)
    assert "(1 restart)" in said_right(badge_html(snapshot))
    snapshot.log_tail = {rank: [f"rank {rank} says hi"] for rank in range(3)}
    page = said_right(render_html(snapshot, max_log_ranks=2))
    assert "and the logs of 1 more rank (job.logs(rank=...))" in page


def test_a_tp_that_does_not_divide_one_rank_per_node_is_said_without_a_plural():
    with pytest.raises(ValueError) as refused:
        JobSpec(entrypoint="t.py", resources={"nodes": 2}, parallelism={"tp": 2})
    said_right(str(refused.value))


def test_plural_is_the_one_helper():
    assert [plural(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
