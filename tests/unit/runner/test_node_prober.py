"""`NodeProber`: the operator's probe turned into node evidence, with real processes."""

from __future__ import annotations

import sys

from air_sdk.runner.node_health import NodeHealthBook
from air_sdk.runner.node_probe import BUILTIN, NodeProber, probe_argv, run_probe
from air_sdk.runner.policy import NodeEvidence, NodeHealthPolicy
from air_sdk.scheduler import NodeSpec

NODES = [NodeSpec("n0", 1), NodeSpec("n1", 1)]


def _unhealthy(book: NodeHealthBook, prober: NodeProber) -> set[str]:
    return NodeHealthPolicy().unhealthy(book.evidence(), 1e12, num_tenants=2) | prober.failing()


def test_the_builtin_probe_passes_on_a_node_without_gpus():
    result = run_probe(probe_argv(BUILTIN), NodeSpec("n0", 1))
    assert result.ok, result.detail


def test_a_failing_probe_alone_leaves_its_node_out_and_a_pass_brings_it_back():
    book = NodeHealthBook()
    script = "import os, sys; sys.exit('broken' if os.environ['AIR_NODE_NAME'] == 'n1' else 0)"
    prober = NodeProber([sys.executable, "-c", script], 60.0, lambda: NODES, book)
    assert prober.probe_now("n0").ok
    failed = prober.probe_now("n1")
    assert not failed.ok and failed.detail == "exit status 1: broken"
    assert _unhealthy(book, prober) == {"n1"}
    assert prober.probe_now("nope") is None
    prober.argv = [sys.executable, "-c", "pass"]
    book.add(NodeEvidence("n1", "crash", "a", "j", 1e12))
    assert prober.probe_now("n1").ok
    assert _unhealthy(book, prober) == set() and book.evidence() == []


def test_a_probe_that_hangs_fails_at_its_timeout():
    result = run_probe([sys.executable, "-c", "import time; time.sleep(30)"], NODES[0], 0.5)
    assert not result.ok and "no answer within 0.5 s" in result.detail
