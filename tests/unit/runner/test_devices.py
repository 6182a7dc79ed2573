"""This machine as virtual nodes: what each node carries about the machine."""

from __future__ import annotations

import os

from air_sdk.runner.devices import Gpu, local_virtual_nodes
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
