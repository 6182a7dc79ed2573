"""accelerate (the real library, in-process) with AIR's AirTracker and the hooks
autolog puts on Accelerator: logs, saves, resumes and weight updates reach AIR."""

from __future__ import annotations

import pytest
import torch

accelerate = pytest.importorskip("accelerate")

from air_sdk.runtime.integrations import _common  # noqa: E402
from air_sdk.runtime.integrations.accelerate import AirTracker  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch, tmp_path):
    monkeypatch.setenv("AIR_CHECKPOINT_DIR", str(tmp_path / "air-ckpt"))
    from air_sdk.runtime.integrations import accelerate as integration

    monkeypatch.setattr(integration._Progress, "optimizer_steps", 0)
    monkeypatch.setattr(integration._Progress, "logged_step", None)
    yield
    accelerate.state.AcceleratorState._reset_state(True)


def train(accelerator, steps: int, start: int = 0):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optim = accelerator.prepare(model, optim)
    for step in range(start + 1, start + steps + 1):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        accelerator.backward(loss)
        optim.step()
        optim.zero_grad()
        accelerator.log({"loss": loss.item(), "note": "text is left out"}, step=step)
    return model, optim


@pytest.mark.parametrize("log_with", [None, "air", ["air"], "tensorboard"])
def test_accelerator_log_becomes_air_series_with_or_without_log_with(posted, tmp_path, log_with):
    accelerator = accelerate.Accelerator(cpu=True, log_with=log_with, project_dir=str(tmp_path))
    accelerator.init_trackers("run")
    train(accelerator, 3)
    accelerator.end_training()
    assert sum(isinstance(t, AirTracker) for t in accelerator.trackers) == 1
    assert [s for s, _ in posted.series("loss")] == [1, 2, 3]
    assert all("note" not in values for _, values in posted.points())


def test_save_state_and_load_state_become_a_checkpoint_and_the_resume(posted, tmp_path):
    from accelerate.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = accelerate.Accelerator(cpu=True, project_config=config)
    train(accelerator, 4)
    location = str(accelerator.save_state())
    [commit] = posted.commits()
    assert (commit.step, commit.path, commit.source) == (4, location, "accelerate")
    assert commit.size_bytes > 0 and commit.num_files >= 2

    # a restarted attempt: a new process knows nothing but the checkpoint and AIR's dir
    from air_sdk.runtime.integrations import accelerate as integration

    integration._Progress.logged_step = None
    accelerate.state.AcceleratorState._reset_state(True)
    again = accelerate.Accelerator(cpu=True, project_config=config)
    train(again, 0)
    again.load_state()
    assert [(r.step, r.path, r.source) for r in posted.restores()] == [(4, location, "accelerate")]


def test_every_weight_update_is_a_heartbeat_on_every_rank(posted, tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "_rank", 1)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optim = accelerator.prepare(model, optim)
    for _ in range(6):  # 6 micro-batches, 3 updates
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.randn(8, 4)).pow(2).mean())
            optim.step()
            optim.zero_grad()
    assert posted.points() == []
    assert posted.heartbeat_steps()[-1] == 3


def test_an_evaluation_loop_keeps_the_heartbeat(posted, monkeypatch):
    marks: list[int | None] = []
    monkeypatch.setattr(_common, "step_done", marks.append)
    accelerator = accelerate.Accelerator(cpu=True)
    for _ in range(3):
        accelerator.gather_for_metrics(torch.ones(2))
    assert marks == [None, None, None]
