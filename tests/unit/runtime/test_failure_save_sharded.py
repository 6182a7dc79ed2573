"""The failure save refuses a sharded state (FSDP, tensor parallel, pipeline parts): a
survivor holds part of it. Apart from test_failure_save.py, whose tests fork DataLoader
workers and so run first in the suite (tests/conftest.py): these build DTensors on
in-process gloo groups, and torch keeps those groups (and their threads) alive in its
per-thread DTensor caches after they are destroyed; the processes forked after them
then inherit a copy of those threads' state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_failure_save import Shipper, make_state, rank_0_of_two, train

torch = pytest.importorskip("torch")

from air_sdk.runtime import _failure_save  # noqa: E402
from air_sdk.runtime.checkpoint import Checkpointer  # noqa: E402

__all__ = ["rank_0_of_two"]  # the autouse fixture: one gloo rank of a job of two


def sharded_fsdp() -> tuple[Any, Any]:
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Linear(4, 2)
    fully_shard(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def sharded_tp() -> tuple[Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    parallelize_module(model, init_device_mesh("cpu", (1,)), {"0": ColwiseParallel()})
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def pipeline_parts() -> tuple[Any, Any]:
    parts = [torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)]
    return parts, [torch.optim.SGD(p.parameters(), lr=0.1) for p in parts]


SHARDED = (
    "state['model'] has sharded (DTensor) parameters (FSDP or tensor parallel): the dead"
    " rank held part of them"
)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (sharded_fsdp, SHARDED),
        (sharded_tp, SHARDED),
        (
            pipeline_parts,
            "state['model'] holds model parts (pipeline stages): the other stages lived on"
            " other ranks, some of them dead",
        ),
    ],
    ids=["fsdp2", "tensor-parallel", "pipeline-parts"],
)
def test_a_sharded_state_is_refused_with_its_reason_and_nothing_is_written(
    tmp_path: Path, rank_0_of_two: Shipper, capsys: pytest.CaptureFixture[str], make, why
) -> None:
    """The failure save covers data parallelism over replicas only: a survivor of an
    FSDP / TP / pipeline job holds part of the state and must not commit it."""
    state = make_state()
    state["model"], state["optim"] = make()
    assert _failure_save.ineligible_state(state) == why
    ckpt = Checkpointer(tmp_path / "ckpt")
    assert ckpt.load(state) is None
    if isinstance(state["model"], torch.nn.Module):  # steps it could vouch for otherwise
        train(state, iter(state["data"]), rank_0_of_two, first=1, n=2)
    assert _failure_save.save_at_failure(_failure_save._tracker) is None
    assert f"no checkpoint at the failure: {why}" in capsys.readouterr().err
    assert ckpt.latest() is None and rank_0_of_two.records == []
    assert not (tmp_path / "attempt" / "failure-saves" / "armed-rank-0").exists()
