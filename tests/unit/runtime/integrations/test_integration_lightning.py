"""Lightning (the real library, in-process) with AIR's AirLogger and AirCallback:
what the Trainer logs, saves and resumes from reaches AIR as points and checkpoint
events, and the user's own loggers, callbacks and directories stay as they were."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from air_sdk.runtime.integrations import _common  # noqa: E402
from air_sdk.runtime.integrations.lightning import AirCallback, AirLogger  # noqa: E402


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> torch.utils.data.DataLoader:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    return torch.utils.data.DataLoader(data, batch_size=4)


def trainer(root: Path, **options) -> pl.Trainer:
    options.setdefault("max_steps", 6)
    options.setdefault("log_every_n_steps", 1)
    return pl.Trainer(
        default_root_dir=str(root),
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **options,
    )


def test_what_lightning_logs_becomes_air_series_at_lightnings_steps(posted, tmp_path):
    csv_logger = pl.loggers.CSVLogger(str(tmp_path), name="csv")
    t = trainer(tmp_path, logger=csv_logger, log_every_n_steps=2, limit_val_batches=2)
    t.fit(Regression(), loader(), loader())
    with open(Path(csv_logger.log_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["train_loss"]]
    expected = [(int(r["step"]), pytest.approx(float(r["train_loss"]))) for r in rows]
    assert len(expected) == 3  # steps 1, 3, 5: every second step
    assert posted.series("train_loss") == expected
    assert [s for s, _ in posted.series("val_loss")] == [5]  # end of the (only) epoch
    assert all("epoch" in values for _, values in posted.points())


def test_checkpoint_saves_become_air_checkpoints_with_path_step_and_size(posted, tmp_path):
    save = pl.callbacks.ModelCheckpoint(
        dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3, save_top_k=-1
    )
    trainer(tmp_path, callbacks=[save], logger=False).fit(Regression(), loader())
    commits = posted.commits()
    assert [c.step for c in commits] == [3, 6]
    for c in commits:
        assert Path(c.path).is_file() and c.path.startswith(str(tmp_path / "ckpt"))
        assert c.size_bytes == os.path.getsize(c.path) > 0 and c.num_files == 1
        assert c.source == "lightning" and c.world_size == 1 and c.blocked_s > 0
    # a save the user makes by hand is one too
    t = trainer(tmp_path, max_steps=1, logger=False, enable_checkpointing=False)
    t.fit(Regression(), loader())
    t.save_checkpoint(tmp_path / "by-hand.ckpt")
    assert posted.commits()[-1].path == str(tmp_path / "by-hand.ckpt")


def test_a_fit_from_a_checkpoint_is_reported_as_the_resume(posted, tmp_path):
    save = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=4)
    trainer(tmp_path, max_steps=4, callbacks=[save], logger=False).fit(Regression(), loader())
    last = posted.commits()[-1].path
    trainer(tmp_path, max_steps=6, logger=False).fit(Regression(), loader(), ckpt_path=last)
    assert [(r.step, r.path, r.source) for r in posted.restores()] == [(4, last, "lightning")]


def test_each_step_is_a_heartbeat_on_ranks_that_log_no_metrics(posted, tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "_rank", 1)  # Lightning's loggers log on rank 0 only
    trainer(tmp_path, logger=False, enable_checkpointing=False).fit(Regression(), loader())
    assert posted.points() == []
    steps = posted.heartbeat_steps()
    assert steps and steps == sorted(steps) and steps[-1] == 6


def test_the_users_loggers_callbacks_and_directories_stay_as_they_were(posted, tmp_path):
    no_logger = trainer(tmp_path, logger=False)
    assert [type(lg).__name__ for lg in no_logger.loggers] == ["AirLogger"]
    assert no_logger.log_dir == str(tmp_path)  # as without any logger
    save = next(cb for cb in no_logger.callbacks if isinstance(cb, pl.callbacks.ModelCheckpoint))
    no_logger.fit(Regression(), loader())
    assert save.dirpath == os.path.join(str(tmp_path), "checkpoints")

    tensorboard = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    with_tb = trainer(tmp_path, logger=tensorboard)
    assert with_tb.logger is tensorboard and isinstance(with_tb.loggers[1], AirLogger)
    assert with_tb.log_dir == tensorboard.log_dir

    mine = AirLogger()
    explicit = trainer(tmp_path, logger=mine, callbacks=[AirCallback()])
    assert explicit.loggers == [mine]
    assert sum(isinstance(cb, AirCallback) for cb in explicit.callbacks) == 1


def test_autolog_disabled_leaves_trainers_alone(posted, tmp_path):
    import air_sdk.runtime as air

    air.autolog(disable=True)
    t = trainer(tmp_path, logger=False)
    assert t.loggers == [] and not any(isinstance(cb, AirCallback) for cb in t.callbacks)
