"""The checkpoint a surviving rank writes when a peer dies (air_sdk.runtime._failure_save):
when it may be written, which step it is, and that `load` restores it. One process, in a
world of one (a real gloo group, so DDP is real) made to look like rank 0 of an AIR job of
two. The whole path through a real job (a peer SIGKILLed, the restart resuming from the
step it died in) is in tests/integration/test_resilience_checkpoints.py."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import air_sdk.runtime as air  # noqa: E402
from air_sdk.runtime import _failure_save, checkpoint  # noqa: E402
from air_sdk.runtime._shipper import MetricsShipper  # noqa: E402
from air_sdk.runtime.checkpoint import Checkpointer  # noqa: E402
from air_sdk.schema.events import CheckpointCommit  # noqa: E402

GLOO_ERROR = (
    "[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:17124:"
    " Connection reset by peer."
)

# DataLoader workers are forked from the test process: run before other tests (conftest.py)
pytestmark = pytest.mark.forks_workers


class Shipper(MetricsShipper):
    """A shipper without a gateway that keeps the checkpoint records it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def add_checkpoint(self, record: Any) -> None:
        self.records.append(dict(record))


@pytest.fixture(autouse=True)
def rank_0_of_two(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Shipper:
    monkeypatch.setenv("AIR_JOB_ID", "job-1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("AIR_ATTEMPT_DIR", str(tmp_path / "attempt"))
    monkeypatch.delenv("AIR_CHECKPOINT_ON_FAILURE", raising=False)
    shipper = Shipper()
    monkeypatch.setattr("air_sdk.runtime._shipper.get_shipper", lambda: shipper)
    monkeypatch.setattr(_failure_save, "_tracker", None)
    monkeypatch.setattr(_failure_save, "_armed", False)
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield shipper
    dist.destroy_process_group()
    gc.collect()  # a DDP model in a cycle may hold the group: free it here, beside its threads


def make_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
    loader = air.resumable_loader(data, batch_size=4, seed=3, num_replicas=1, rank=0)
    return {"model": model, "optim": optim, "data": loader}


def train(state: dict[str, Any], batches: Any, shipper: Shipper, first: int, n: int) -> None:
    """n steps numbered first.. first+n-1, each logged after its optimizer step."""
    for step in range(first, first + n):
        x, y = next(batches)
        state["optim"].zero_grad()
        F.mse_loss(state["model"](x), y).backward()
        state["optim"].step()
        shipper.log(step=step)


def failing_backward(state: dict[str, Any], batches: Any) -> tuple[BaseException, Any]:
    """A step whose gradient all-reduce fails as gloo's does when a peer died."""
    x, y = next(batches)
    loss = F.mse_loss(state["model"](x), y)

    def peer_died(_grad: Any) -> Any:
        raise RuntimeError(GLOO_ERROR)

    loss.register_hook(peer_died)
    with pytest.raises(RuntimeError) as caught:
        loss.backward()
    return caught.value, caught.tb


def test_a_survivor_saves_the_last_completed_step_and_load_restores_it_exactly(
    tmp_path: Path, rank_0_of_two: Shipper
) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt")
    state = make_state()
    assert ckpt.load(state) is None  # fresh: steps count from 0
    batches = iter(state["data"])
    train(state, batches, rank_0_of_two, first=1, n=5)
    expected = {k: v.clone() for k, v in state["model"].module.state_dict().items()}
    position = state["data"].state_dict()
    exc, tb = failing_backward(state, batches)  # step 6 takes a batch, then fails

    assert _failure_save.collective_failure(exc, tb)
    assert _failure_save.save_at_failure(_failure_save._tracker) == 5
    step_dir = tmp_path / "ckpt" / "step-5"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["step"] == 5 and manifest["world_size"] == 2
    assert manifest["data_position"] == {"data": position}  # before step 6's batch
    assert not (tmp_path / "attempt" / "failure-saves" / "rank-0").exists()
    [record] = rank_0_of_two.records
    commit = CheckpointCommit.model_validate(record)
    assert (commit.step, commit.at_failure, commit.world_size) == (5, True, 2)
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]

    fresh = make_state(seed=1)
    assert Checkpointer(tmp_path / "ckpt").load(fresh) == 5
    got = fresh["model"].module.state_dict()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert fresh["data"].state_dict() == position
    assert fresh["optim"].state_dict()["state"][0]["momentum_buffer"] is not None


def test_a_second_survivor_leaves_the_first_ones_checkpoint(
    tmp_path: Path, rank_0_of_two: Shipper
) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt")
    state = make_state()
    ckpt.load(state)
    batches = iter(state["data"])
    train(state, batches, rank_0_of_two, first=1, n=3)
    assert _failure_save.save_at_failure(_failure_save._tracker) == 3
    before = (tmp_path / "ckpt" / "step-3" / "manifest.json").read_bytes()
    assert _failure_save.save_at_failure(_failure_save._tracker) == 3
    assert (tmp_path / "ckpt" / "step-3" / "manifest.json").read_bytes() == before
    assert len(rank_0_of_two.records) == 1


def test_the_step_counts_from_the_last_save(tmp_path: Path, rank_0_of_two: Shipper) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt")
    state = make_state()
    batches = iter(state["data"])
    train(state, batches, rank_0_of_two, first=1, n=4)
    ckpt.save(state, step=4, block=True)
    tracker = _failure_save._tracker
    assert tracker is not None and tracker.step_to_save() == (
        None,
        "no optimizer step since step 4 was saved or loaded",
    )
    train(state, batches, rank_0_of_two, first=5, n=2)
    assert tracker.step_to_save() == (6, "")


def test_an_optimizer_step_not_yet_logged_is_not_vouched_for(
    tmp_path: Path, rank_0_of_two: Shipper
) -> None:
    state = make_state()
    Checkpointer(tmp_path / "ckpt").load(state)
    batches = iter(state["data"])
    train(state, batches, rank_0_of_two, first=1, n=2)
    x, y = next(batches)
    F.mse_loss(state["model"](x), y).backward()
    state["optim"].step()  # step 3 changed the weights, but no air.log(step=3) yet
    assert _failure_save._tracker.step_to_save() == (
        None,
        "no air.log(step=...) after the last optimizer step",
    )
    assert _failure_save.save_at_failure(_failure_save._tracker) is None
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())


def test_logged_micro_steps_that_are_not_optimizer_steps_are_not_vouched_for(
    tmp_path: Path, rank_0_of_two: Shipper
) -> None:
    state = make_state()
    Checkpointer(tmp_path / "ckpt").load(state)
    batches = iter(state["data"])
    for micro in range(1, 5):  # gradient accumulation: 4 logged micro-steps, 1 optimizer step
        x, y = next(batches)
        F.mse_loss(state["model"](x), y).backward()
        if micro == 4:
            state["optim"].step()
        rank_0_of_two.log(step=micro)
    step, why = _failure_save._tracker.step_to_save()
    assert step is None and "air.log marked step 4 but 1 optimizer steps after step 0" in why


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"epoch": 3}, "state['epoch'] (int) may have changed since the last completed step"),
        (
            {"ema": torch.zeros(2)},
            "state['ema'] (Tensor) may have changed since the last completed step",
        ),
        (
            {"head": torch.nn.Linear(2, 2)},
            "state['head'] (Linear) is not DistributedDataParallel: the surviving ranks"
            " may not hold all of it",
        ),
    ],
)
def test_a_state_a_survivor_cannot_vouch_for_is_not_saved(
    tmp_path: Path, rank_0_of_two: Shipper, capsys: pytest.CaptureFixture[str], extra, why
) -> None:
    state = {**make_state(), **extra}
    assert _failure_save.ineligible_state(state) == why
    Checkpointer(tmp_path / "ckpt").load(state)
    train(state, iter(state["data"]), rank_0_of_two, first=1, n=2)
    assert _failure_save.save_at_failure(_failure_save._tracker) is None
    assert f"no checkpoint at the failure: {why}" in capsys.readouterr().err


def test_without_an_optimizer_there_is_no_step_to_vouch_for(tmp_path: Path) -> None:
    state = make_state()
    Checkpointer(tmp_path / "ckpt").load({"model": state["model"]})
    assert _failure_save._tracker.step_to_save() == (
        None,
        "no optimizer in the state: its steps are what count completed steps",
    )


def test_a_scheduler_and_a_plain_ddp_state_are_eligible() -> None:
    state = make_state()
    state["sched"] = torch.optim.lr_scheduler.StepLR(state["optim"], step_size=2)
    assert _failure_save.ineligible_state(state) is None


def test_only_a_collective_failure_inside_backward_counts() -> None:
    state = make_state()
    batches = iter(state["data"])
    exc, tb = failing_backward(state, batches)
    assert _failure_save.collective_failure(exc, tb)
    try:
        raise RuntimeError(GLOO_ERROR)  # e.g. a logging all_reduce after optimizer.step()
    except RuntimeError as outside:
        assert not _failure_save.collective_failure(outside, outside.__traceback__)
    x, y = next(batches)
    loss = F.mse_loss(state["model"](x), y)
    loss.register_hook(lambda _g: (_ for _ in ()).throw(ValueError("nan in the loss")))
    with pytest.raises(ValueError) as caught:
        loss.backward()
    assert not _failure_save.collective_failure(caught.value, caught.tb)


def test_off_by_configure_or_outside_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank_0_of_two: Shipper
) -> None:
    monkeypatch.setattr(checkpoint, "_default", None)
    air.checkpoint.configure(tmp_path / "ckpt", on_failure=False).load(make_state())
    assert _failure_save._tracker is None
    monkeypatch.setenv("AIR_CHECKPOINT_ON_FAILURE", "0")
    Checkpointer(tmp_path / "ckpt").load(make_state())
    assert _failure_save._tracker is None
    monkeypatch.delenv("AIR_CHECKPOINT_ON_FAILURE")
    monkeypatch.delenv("AIR_JOB_ID")
    Checkpointer(tmp_path / "ckpt").load(make_state())
    assert _failure_save._tracker is None
    monkeypatch.setenv("AIR_JOB_ID", "job-1")
    Checkpointer(tmp_path / "ckpt").load(make_state())
    assert _failure_save._tracker is not None


def test_a_rank_that_could_save_tells_the_runner_and_takes_it_back(tmp_path: Path) -> None:
    """`failure-saves/armed-rank-R` makes the runner wait for survivors to notice a
    failure before it stops them (else its SIGTERM can beat their save)."""
    armed = tmp_path / "attempt" / "failure-saves" / "armed-rank-0"
    Checkpointer(tmp_path / "ckpt").load(make_state())
    assert armed.exists()
    Checkpointer(tmp_path / "ckpt").load({**make_state(), "epoch": 1})
    assert not armed.exists()
    Checkpointer(tmp_path / "ckpt").load(make_state())
    assert armed.exists()
    Checkpointer(tmp_path / "ckpt", on_failure=False).load(make_state())
    assert not armed.exists()


def test_an_armed_rank_says_when_it_is_past_its_save(
    tmp_path: Path, rank_0_of_two: Shipper, capsys: pytest.CaptureFixture[str]
) -> None:
    """`done-rank-R`: the runner need not wait for the rank's (slow) exit after a peer
    died, once its save is written, or once it chose not to save."""
    done = tmp_path / "attempt" / "failure-saves" / "done-rank-0"
    state = make_state()
    Checkpointer(tmp_path / "ckpt").load(state)
    batches = iter(state["data"])
    train(state, batches, rank_0_of_two, first=1, n=2)
    exc, tb = failing_backward(state, batches)
    _failure_save._excepthook(RuntimeError, exc, tb)
    assert done.exists() and (tmp_path / "ckpt" / "step-2" / "manifest.json").exists()
    assert "Connection reset by peer" in capsys.readouterr().err  # still reported
    done.unlink()
    try:
        raise ValueError("a bug, not a peer's death")
    except ValueError as bug:
        _failure_save._excepthook(ValueError, bug, bug.__traceback__)
    assert done.exists() and not (tmp_path / "ckpt" / "step-3").exists()


def test_a_survivor_saves_a_sharded_datasets_position_as_of_the_last_step(
    tmp_path: Path, rank_0_of_two: Shipper
) -> None:
    # Its state_dict() agrees on the position with a collective, which cannot run once a
    # peer died: the survivor saves its own view (every DDP rank consumed as many batches).
    from shard_files import SEQ_LEN, token_shards

    from air_sdk.runtime.data import ShardedDataset, loader, write_index

    root = token_shards(tmp_path / "tokens")
    write_index(root)

    def sharded_state(seed: int) -> dict[str, Any]:
        state = make_state(seed)
        data = ShardedDataset(root, seq_len=SEQ_LEN, seed=4, dp_rank=0, dp_size=1)
        state["data"] = loader(data, 4, num_workers=1)
        return state

    def pairs(stream: Any) -> Any:
        for batch in stream:
            yield batch[:, :4].float(), batch[:, 4:6].float()

    ckpt = Checkpointer(tmp_path / "ckpt")
    state = sharded_state(0)
    assert ckpt.load(state) is None
    assert _failure_save._tracker is not None and _failure_save._tracker.problem is None
    batches = pairs(state["data"])
    train(state, batches, rank_0_of_two, first=1, n=3)
    position = state["data"].state_dict()
    assert position["position"] == 12
    exc, tb = failing_backward(state, batches)  # step 4 takes a batch, then fails
    assert _failure_save.collective_failure(exc, tb)
    assert _failure_save.save_at_failure(_failure_save._tracker) == 3

    fresh = sharded_state(1)
    assert Checkpointer(tmp_path / "ckpt").load(fresh) == 3
    assert fresh["data"].state_dict() == position  # step 4's batch is read again
    expected = list(pairs(state["data"]))  # what the first run had left after step 4's
    resumed = list(pairs(fresh["data"]))
    assert len(resumed) == len(expected) + 1
    assert all(torch.equal(a[0], b[0]) for a, b in zip(resumed[1:], expected, strict=True))
