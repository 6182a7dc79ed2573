"""air.checkpoint across 2 gloo ranks under torchrun: a stopped run resumed in a new launch
ends with exactly the parameters of an uninterrupted one, past torn and uncommitted checkpoints.

Two launches keep it to about 10 s of torchrun start-up on an idle machine: the first trains
run A (DDP) straight through, round-trips an FSDP2 model, and trains run B until it stops;
the second resumes B, and a copy of B whose newest checkpoint the test tore, and posts to a
fake gateway.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest
from airtest import torchrun_two_ranks
from test_runtime_shipper import FakeGateway

from air_sdk.schema.events import CheckpointCommit, CheckpointSkip, WorkerReport

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

TOTAL_STEPS = 8  # 20 samples, 2 ranks, batches of 4: 3 steps per epoch

TRAIN = """
import os
import sys

import torch
import torch.nn.functional as F

import air_sdk.runtime as air


def run(directory, stop_after, keep, out):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(20, 6), torch.randn(20, 2))
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    )
    optim = torch.optim.AdamW(model.parameters(), lr=0.05)
    loader = air.resumable_loader(data, batch_size=4, seed=7)
    state = {"model": model, "optim": optim, "data": loader, "note": "fresh"}
    air.checkpoint.configure(directory, keep=keep)
    step = air.checkpoint.load(state) or 0
    if air.is_main():
        print(f"{os.path.basename(directory)} starts after {step} ({state['note']})", flush=True)
    while step < stop_after:
        for x, y in loader:
            step += 1
            optim.zero_grad()
            F.mse_loss(model(x), y).backward()
            optim.step()
            state["note"] = f"noted at {step}"
            if step % 2 == 0:
                air.checkpoint.save(state, step=step)
            if step == stop_after:
                break
        else:
            loader.set_epoch(loader.epoch + 1)
    if air.is_main():
        torch.save(model.module.state_dict(), out)


def fsdp2_round_trip(directory):
    from torch.distributed.fsdp import fully_shard

    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 2))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=0.05)

    def one_step(model, optim):
        torch.manual_seed(5)
        optim.zero_grad()
        model(torch.randn(4, 6)).sum().backward()
        optim.step()

    model, optim = build(0)
    one_step(model, optim)
    air.checkpoint.configure(directory)
    air.checkpoint.save({"model": model, "optim": optim}, step=1, block=True)
    other, other_optim = build(1)
    air.checkpoint.load({"model": other, "optim": other_optim})
    one_step(model, optim)  # equal after a step: the optimizer state came back too
    one_step(other, other_optim)
    pairs = zip(model.state_dict().values(), other.state_dict().values())
    same = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in pairs)
    if air.is_main():
        print(f"fsdp2 resumed equal: {same}", flush=True)


if __name__ == "__main__":
    root, phase = sys.argv[1], sys.argv[2]
    air.init(timeout_s=60)
    if phase == "first":
        run(f"{root}/A", TOTAL_STEPS, 2, f"{root}/A.pt")
        fsdp2_round_trip(f"{root}/F")
        run(f"{root}/B", 7, 3, f"{root}/B-stopped.pt")  # step 6 may still be in flight at exit
    else:
        run(f"{root}/B", TOTAL_STEPS, 3, f"{root}/B.pt")
        run(f"{root}/B2", TOTAL_STEPS, 3, f"{root}/B2.pt")
    air.shutdown()
""".replace("TOTAL_STEPS", str(TOTAL_STEPS))


def torchrun(tmp_path: Path, phase: str, **extra_env: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    return torchrun_two_ranks(script, str(tmp_path), phase, **extra_env)


def committed(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if (p / "manifest.json").exists())


def assert_same_parameters(a: Path, b: Path) -> None:
    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), f"{b.name}: {name} differs"


def test_a_resumed_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path: Path) -> None:
    out = torchrun(tmp_path, "first")
    assert "A starts after 0 (fresh)" in out and "B starts after 0 (fresh)" in out
    assert "fsdp2 resumed equal: True" in out
    assert sorted(os.listdir(tmp_path / "A")) == ["step-6", "step-8"]  # keep=2: newest two
    assert committed(tmp_path / "B") == ["step-2", "step-4", "step-6"]  # 6 committed at exit

    # B2: B with its newest checkpoint torn, plus what a crash in a later save leaves behind
    shutil.copytree(tmp_path / "B", tmp_path / "B2")
    torn = tmp_path / "B2" / "step-6" / "__1_0.distcp"
    torn.write_bytes(torn.read_bytes()[:-64])
    (tmp_path / "B2" / "step-9").mkdir()
    (tmp_path / "B2" / "step-9" / "__0_0.distcp").write_bytes(b"partial")

    gateway = FakeGateway()
    try:
        out = torchrun(
            tmp_path,
            "resume",
            AIR_GATEWAY_URL=gateway.base_url,
            AIR_JOB_ID="job-1",
            AIR_JOB_TOKEN="tok",
            AIR_ATTEMPT="1",
        )
    finally:
        gateway.close()

    # B resumes at an epoch boundary (after step 6), B2 mid-epoch (after step 4, the first
    # batch of epoch 1), skipping the torn step 6 and ignoring step-9 (never committed).
    assert "B starts after 6 (noted at 6)" in out
    assert "B2 starts after 4 (noted at 4)" in out
    assert "skipped checkpoint step 6: file __1_0.distcp" in out
    assert_same_parameters(tmp_path / "A.pt", tmp_path / "B.pt")
    assert_same_parameters(tmp_path / "A.pt", tmp_path / "B2.pt")
    stopped, final = torch.load(tmp_path / "B-stopped.pt"), torch.load(tmp_path / "A.pt")
    assert not all(torch.equal(stopped[k], final[k]) for k in final)  # the check can fail
    assert committed(tmp_path / "B2") == ["step-4", "step-6", "step-8"]
    assert sorted(os.listdir(tmp_path / "B2")) == ["step-4", "step-6", "step-8", "step-9"]

    records = [
        record
        for body in gateway.reports
        for record in WorkerReport.model_validate(body).checkpoints
        if body["rank"] == 0
    ]
    skips = [r for r in records if isinstance(r, CheckpointSkip)]
    commits = [r for r in records if isinstance(r, CheckpointCommit)]
    assert [(s.step, s.attempt) for s in skips] == [(6, 1)]
    assert "__1_0.distcp" in skips[0].skipped
    assert [(c.step, Path(c.path).parent.name) for c in commits] == [
        (8, "B"),
        (6, "B2"),
        (8, "B2"),
    ]
    assert all(c.world_size == 2 and c.num_files == 3 and c.size_bytes > 0 for c in commits)
    assert all(0 <= c.blocked_s <= c.durable_s for c in commits)
    assert all(body["rank"] == 0 for body in gateway.reports if body.get("checkpoints"))
