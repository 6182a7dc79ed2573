"""This machine as virtual nodes: what each node carries about the machine."""

from __future__ import annotations

import os

from air_sdk.runner.devices import Gpu, local_virtual_nodes
from air_sdk.runner.machine import MachineCap, oversubscription
from air_sdk.scheduler import MACHINE_CORES_LABEL, MACHINE_GPUS_LABEL, JobRequest, fits_ever


def test_local_virtual_nodes_carry_what_the_machine_has():
    nodes = local_virtual_nodes(2, gpus=[Gpu(0, "h100", 80_000), Gpu(1, "h100", 80_000)])
    assert [n.gpus for n in nodes] == [(0,), (1,)]
    for node in nodes:
        assert node.labels == {MACHINE_CORES_LABEL: str(os.cpu_count()), MACHINE_GPUS_LABEL: "2"}


def test_a_job_too_wide_for_this_machine_is_told_the_gateway_flag():
    nodes = local_virtual_nodes(2, slots_per_node=1, gpus=[])
    reason = fits_ever(JobRequest("j", 2, 3), nodes) or ""
    assert "restart the gateway with --slots-per-node 3" in reason
    assert f"this machine: {os.cpu_count()} core" in reason


def test_a_two_core_machine_by_default_fits_one_node_of_two_ranks_not_four_ranks():
    nodes = local_virtual_nodes(2, gpus=[], cores=2)
    assert [n.slots for n in nodes] == [2, 2]
    cap = MachineCap.of(nodes)
    assert cap is not None and cap.max_ranks == 2
    for shape in ((1, 2), (2, 1)):  # a 1-node x 2-rank job and `make demo`'s 2 x 1
        assert fits_ever(JobRequest("j", *shape), nodes) is None
        assert cap.never(JobRequest("j", *shape)) is None
    assert "restart the gateway with --oversubscribe" in (cap.never(JobRequest("j", 2, 2)) or "")
    assert oversubscription(nodes, cores=2) is None


def test_oversubscribing_is_explicit_and_warned():
    lifted = local_virtual_nodes(2, gpus=[], cores=2, oversubscribe=True)
    assert MachineCap.of(lifted) is None
    assert oversubscription(lifted, cores=2) == (
        "oversubscribed: 2 virtual nodes x 2 slots = 4 ranks on 2 cores; ranks beyond the"
        " cores share them (slower, and timing-sensitive code may time out)"
    )
    explicit = local_virtual_nodes(2, slots_per_node=2, gpus=[], cores=2)
    assert MachineCap.of(explicit) is None and oversubscription(explicit, cores=2)
    within = local_virtual_nodes(2, slots_per_node=1, gpus=[], cores=2)
    assert MachineCap.of(within) is not None and oversubscription(within, cores=2) is None


def test_gpu_nodes_are_not_capped_by_cores():
    gpus = [Gpu(0, "h100", 80_000), Gpu(1, "h100", 80_000)]
    assert MachineCap.of(local_virtual_nodes(2, gpus=gpus, cores=2)) is None
