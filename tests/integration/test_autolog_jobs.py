"""Unmodified Lightning, transformers and accelerate scripts as 2-node AIR jobs (gloo,
1 rank per node): autolog makes their metrics, checkpoints and progress AIR's, and
after a SIGKILL of one rank the job restarts and the library resumes from its own
checkpoint."""

from __future__ import annotations

import json
import os
import signal

import pytest
from airtest import no_processes_left, rank_pid, wait_for

from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

#: what every script writes once it knows where it starts: rank, attempt, restart count
REPORT = """
def report(out, step):
    import json, os
    name = f"rank-{os.environ['RANK']}-attempt-{os.environ['AIR_ATTEMPT']}.json"
    with open(os.path.join(out, name), "w") as f:
        json.dump({"start_step": step,
                   "restart_count": os.environ.get("TORCHELASTIC_RESTART_COUNT")}, f)
"""

LIGHTNING = (
    REPORT
    + """
import os, sys, time, torch
import lightning.pytorch as pl

out, steps = sys.argv[1], int(sys.argv[2])

class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        time.sleep(0.15)
        return loss
    def on_train_start(self):
        report(out, self.trainer.global_step)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

if __name__ == "__main__":
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    save = pl.callbacks.ModelCheckpoint(
        dirpath=os.path.join(out, "ckpt"), every_n_train_steps=5, save_top_k=-1, save_last=True)
    trainer = pl.Trainer(
        strategy="ddp", num_nodes=2, devices=1, accelerator="cpu", max_steps=steps,
        log_every_n_steps=1, callbacks=[save], default_root_dir=out,
        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regression(), loader, ckpt_path="last")
"""
)

TRANSFORMERS = (
    REPORT
    + """
import sys, time, torch, transformers
from transformers.trainer_utils import get_last_checkpoint

out, steps = sys.argv[1], int(sys.argv[2])

class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (512, 8), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}

class Slow(transformers.TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        report(out, state.global_step)
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.15)

if __name__ == "__main__":
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
        save_steps=5, report_to="none", use_cpu=True, ddp_backend="gloo", disable_tqdm=True)
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
        callbacks=[Slow()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(out))
"""
)

ACCELERATE = (
    REPORT
    + """
import os, sys, time, torch
from accelerate import Accelerator

out, steps = sys.argv[1], int(sys.argv[2])

if __name__ == "__main__":
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=out)
    accelerator.init_trackers("regression")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optim, loader = accelerator.prepare(model, optim, loader)
    saved = sorted((int(n.split("_")[1]), n) for n in os.listdir(out) if n.startswith("step_"))
    step = 0
    if saved:
        accelerator.load_state(os.path.join(out, saved[-1][1]))
        step = saved[-1][0]
    report(out, step)
    while step < steps:
        for x, y in accelerator.skip_first_batches(loader, step % len(loader)):
            step += 1
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optim.step()
            optim.zero_grad()
            accelerator.log({"loss": loss.item()}, step=step)
            if step % 5 == 0:
                accelerator.save_state(os.path.join(out, f"step_{step}"))
            time.sleep(0.15)
            if step == steps:
                break
    accelerator.end_training()
"""
)

#: library -> (script, how a finished checkpoint of step N looks on disk)
CASES = {
    "lightning": (LIGHTNING, lambda out, n: out / "ckpt" / f"epoch=0-step={n}.ckpt"),
    "transformers": (TRANSFORMERS, lambda out, n: out / f"checkpoint-{n}" / "trainer_state.json"),
    "accelerate": (ACCELERATE, lambda out, n: out / f"step_{n}"),
}
STEPS = 30


@pytest.mark.parametrize("library", sorted(CASES))
def test_an_unmodified_library_job_is_seen_checkpointed_and_resumed(
    gateway, workdir, tmp_path, library
):
    pytest.importorskip(
        library, reason=f"{library} comes with the dev extra (pip install -e '.[dev]')"
    )
    script, finished = CASES[library]
    out = tmp_path / "out"
    out.mkdir()
    job = gateway.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(out), str(STEPS)],
            resources=Resources(nodes=2),
            max_restarts=1,
            failure={"backoff_base_s": 0.2, "backoff_max_s": 0.5},
        ),
        workdir=workdir(script),
    )
    wait_for(lambda: finished(out, 10).exists(), 240, f"{library}'s checkpoint of step 10")
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGKILL)
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason

    # the library's metrics are AIR's, at the library's steps, from rank 0
    rows = job.metrics()
    assert rows and {r.rank for r in rows} == {0}
    assert max(r.step for r in rows) >= STEPS - 1
    assert any(set(r.values) & {"train_loss", "loss"} for r in rows)

    # its checkpoints are AIR's, the restart resumed from one of them
    found = job.checkpoints()
    mine = [c for c in found.commits if c.source == library]
    assert {5, 10} <= {c.step for c in mine if c.attempt == found.commits[0].attempt}
    assert all(c.size_bytes > 0 for c in mine)
    attempts = job.attempts()
    assert len(attempts) == 2
    [restore] = found.restores
    assert restore.source == library and restore.step >= 10
    assert restore.step in {c.step for c in mine}
    second = attempts[1].attempt
    starts = {
        rank: json.loads((out / f"rank-{rank}-attempt-{second}.json").read_text())
        for rank in (0, 1)
    }
    assert all(s["start_step"] == restore.step for s in starts.values()), starts

    # progress was seen: the job's time counted as productive
    assert (job.record().goodput or 0) > 0
    assert no_processes_left(job.id)
    # AIR's restart is torchrun's restart count (helper `node`'s change to the backends)
    assert all(s["restart_count"] == "1" for s in starts.values()), starts


def test_air_autolog_0_leaves_the_library_alone(gateway, workdir, tmp_path):
    pytest.importorskip("accelerate")
    out = tmp_path / "out"
    out.mkdir()
    job = gateway.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(out), "3"],
            resources=Resources(nodes=2),
            env={"AIR_AUTOLOG": "0"},
        ),
        workdir=workdir(ACCELERATE.replace("time.sleep(0.15)", "pass")),
    )
    assert job.wait(timeout=240).state is JobState.SUCCEEDED
    assert job.metrics() == [] and job.checkpoints().commits == []
