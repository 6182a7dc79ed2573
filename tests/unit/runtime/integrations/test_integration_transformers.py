"""transformers' Trainer (the real library, a tiny GPT-2 built from a config, in-process)
with AIR's AirCallback: its logs, checkpoints and resume reach AIR, whatever
`report_to` says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from air_sdk.runtime.integrations.transformers import AirCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, length: int = 8) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_trainer(out: Path, **args) -> transformers.Trainer:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    options = dict(
        output_dir=str(out),
        max_steps=6,
        per_device_train_batch_size=4,
        logging_steps=2,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    options.update(args)
    return transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=transformers.TrainingArguments(**options),
        train_dataset=Tokens(),
        eval_dataset=Tokens(4),
    )


def test_what_the_trainer_logs_becomes_air_series_at_its_global_step(posted, tmp_path):
    trainer = make_trainer(tmp_path, eval_strategy="steps", eval_steps=6)
    assert sum(isinstance(cb, AirCallback) for cb in trainer.callback_handler.callbacks) == 1
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [s for s, _ in posted.series("loss")] == [2, 4, 6]
    assert posted.series("loss") == [(h["step"], pytest.approx(h["loss"])) for h in history]
    assert {"learning_rate", "epoch", "grad_norm"} <= {k for _, v in posted.points() for k in v}
    assert [s for s, _ in posted.series("eval_loss")] == [6]
    assert posted.series("train_steps_per_second")  # the end-of-training summary


def test_checkpoints_and_the_resume_from_one_become_air_events(posted, tmp_path):
    make_trainer(tmp_path, save_strategy="steps", save_steps=3).train()
    commits = posted.commits()
    assert [(c.step, c.path) for c in commits] == [
        (3, str(tmp_path / "checkpoint-3")),
        (6, str(tmp_path / "checkpoint-6")),
    ]
    assert all(c.source == "transformers" and c.size_bytes > 0 and c.num_files > 3 for c in commits)

    make_trainer(tmp_path, max_steps=8).train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert [(r.step, r.path) for r in posted.restores()] == [(6, str(tmp_path / "checkpoint-6"))]


def test_an_explicit_callback_is_not_added_twice(posted, tmp_path):
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2)),
        args=transformers.TrainingArguments(str(tmp_path), report_to="none", use_cpu=True),
        callbacks=[AirCallback()],
    )
    assert sum(isinstance(cb, AirCallback) for cb in trainer.callback_handler.callbacks) == 1


def test_each_step_is_a_heartbeat_on_ranks_that_log_no_metrics(posted, tmp_path, monkeypatch):
    from air_sdk.runtime.integrations import _common

    monkeypatch.setattr(_common, "_rank", 1)
    trainer = make_trainer(tmp_path)
    monkeypatch.setattr(trainer, "is_world_process_zero", lambda: False)  # as on rank 1
    trainer.train()
    assert posted.points() == []
    steps = posted.heartbeat_steps()
    assert steps and steps == sorted(steps) and steps[-1] == 6


def test_the_jobs_checkpoint_interval_makes_the_trainer_save(posted, tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_CHECKPOINT_EVERY", "2")
    make_trainer(tmp_path, save_strategy="no").train()
    assert [c.step for c in posted.commits()] == [2, 4, 6]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-6",
    ]
