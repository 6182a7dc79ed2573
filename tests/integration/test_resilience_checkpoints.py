"""Fault injection with checkpoints, through a real gateway: a resumed job ends with the
parameters of an uninterrupted one, and restore never uses a torn or uncommitted
checkpoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from airtest import no_processes_left, rank_pid, wait_for

from air_sdk.schema import EventType, JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

TRAIN = """
import os, signal, sys, time
import torch
import torch.nn.functional as F
import air_sdk.runtime as air

total, every, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ballast_mib = int(sys.argv[4]) if len(sys.argv) > 4 else 0
die_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0  # rank 1 dies as it starts this step
ctx = air.init()
if len(sys.argv) > 6:
    air.checkpoint.configure(on_failure=sys.argv[6] == "1")
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 6), torch.randn(64, 2))
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
)
optim = torch.optim.SGD(model.parameters(), lr=0.05)
loader = air.resumable_loader(data, batch_size=4, seed=7)
state = {"model": model, "optim": optim, "data": loader}
if ballast_mib:  # dead weight that makes every checkpoint write take a while
    state["ballast"] = torch.zeros(ballast_mib << 18)
step = air.checkpoint.load(state) or 0
fresh = step == 0
print(f"attempt {ctx.attempt} resumes after step {step}", flush=True)
while step < total:
    for x, y in loader:
        step += 1
        if fresh and ctx.rank == 1 and step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        optim.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        air.log(step=step, loss=loss.item())
        if step % every == 0:
            air.checkpoint.save(state, step=step)
        # rank 0 is still asleep when rank 1 dies: the runner sees the death first
        time.sleep(1.5 if fresh and ctx.rank == 0 and step == die_at - 1 else 0.05)
        if step == total:
            break
    else:
        loader.set_epoch(loader.epoch + 1)
air.checkpoint.wait()
if air.is_main():
    torch.save(model.module.state_dict(), out)
del model
air.shutdown()
"""


def ckpt_dir(gateway_process, job_id: str) -> Path:
    return gateway_process.log_path.parent / "jobs" / job_id / "checkpoints"


def committed(directory: Path, step: int) -> bool:
    return (directory / f"step-{step}" / "manifest.json").exists()


def submit(
    gateway, src, out: Path, *, total=40, every=10, ballast_mib=0, die_at=0, extra=(), **spec
):
    spec.setdefault("failure", {"backoff_base_s": 0.2, "backoff_max_s": 0.5})
    return gateway.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(total), str(every), str(out), str(ballast_mib), str(die_at), *extra],
            resources=Resources(nodes=2),
            **spec,
        ),
        workdir=src,
    )


def kill_all_ranks(job_id: str) -> None:
    for rank in (0, 1):
        pid = rank_pid(job_id, rank)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def final_params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_kill_and_resume_ends_with_the_parameters_of_an_uninterrupted_run(
    gateway, gateway_process, workdir, tmp_path
):
    src = workdir(TRAIN)
    straight = submit(gateway, src, tmp_path / "straight.pt")
    assert straight.wait(timeout=180).state is JobState.SUCCEEDED

    job = submit(gateway, src, tmp_path / "resumed.pt", max_restarts=1)
    directory = ckpt_dir(gateway_process, job.id)
    wait_for(lambda: committed(directory, 20), 120, "checkpoint 20")
    os.kill(wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1"), signal.SIGKILL)
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    attempts = job.attempts()
    assert len(attempts) == 2 and attempts[1].resumed_from_step is not None
    assert attempts[1].resumed_from_step >= 20  # never older than the newest committed
    found = job.checkpoints()
    assert {10, 20} <= {c.step for c in found.commits if c.attempt == 1}
    assert [(r.attempt, r.step) for r in found.restores] == [(2, attempts[1].resumed_from_step)]
    a, b = final_params(tmp_path / "straight.pt"), final_params(tmp_path / "resumed.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert no_processes_left(job.id)


@pytest.mark.parametrize("on_failure", ["1", "0"])
def test_a_survivor_checkpoints_the_step_a_peer_died_in(
    gateway, gateway_process, workdir, tmp_path, on_failure
):
    """Rank 1 dies as step 27 starts, while rank 0 still sleeps after step 26: the runner
    sees the death first and gives rank 0 time to notice it. Rank 0's all-reduce of step
    27 fails, and it saves step 26 (the default), so the restart redoes no step;
    with it off (`configure(on_failure=False)`) the restart resumes from the periodic
    checkpoint of step 20."""
    src = workdir(TRAIN)
    straight = submit(gateway, src, tmp_path / "straight.pt")
    assert straight.wait(timeout=180).state is JobState.SUCCEEDED

    job = submit(
        gateway,
        src,
        tmp_path / "resumed.pt",
        die_at=27,
        max_restarts=1,
        extra=[on_failure],  # air.checkpoint.configure(on_failure=...)
    )
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    attempts = job.attempts()
    assert len(attempts) == 2
    found = job.checkpoints()
    at_failure = [(c.attempt, c.step) for c in found.commits if c.at_failure]
    if on_failure == "1":
        assert attempts[1].resumed_from_step == 26
        assert at_failure == [(1, 26)]
        assert any("saved checkpoint step 26 at the failure" in x.text for x in job.logs(rank=0))
    else:
        assert attempts[1].resumed_from_step == 20
        assert at_failure == []
    a, b = final_params(tmp_path / "straight.pt"), final_params(tmp_path / "resumed.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    directory = ckpt_dir(gateway_process, job.id)
    assert not [p.name for p in directory.iterdir() if p.name.startswith(".failure-step-")]
    assert no_processes_left(job.id)


def test_sigkill_of_every_rank_during_a_checkpoint_write(
    gateway, gateway_process, workdir, tmp_path
):
    # ballast makes each write take seconds; kill once step 20's directory exists but
    # before its manifest does
    job = submit(gateway, workdir(TRAIN), tmp_path / "out.pt", ballast_mib=256, max_restarts=1)
    directory = ckpt_dir(gateway_process, job.id)
    wait_for(
        lambda: (directory / "step-20").is_dir() and not committed(directory, 20),
        120,
        "checkpoint 20 being written",
    )
    kill_all_ranks(job.id)
    record = job.wait(timeout=240)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    resumed = job.attempts()[1].resumed_from_step
    # the torn step-20 is never restored; the newest committed one before it is
    assert resumed == 10
    assert no_processes_left(job.id)


@pytest.mark.parametrize("damage", ["truncate a file", "delete the manifest"])
def test_a_damaged_newest_checkpoint_is_passed_over(
    gateway, gateway_process, workdir, tmp_path, damage
):
    job = submit(
        gateway,
        workdir(TRAIN),
        tmp_path / "out.pt",
        total=60,
        max_restarts=1,
        failure={"backoff_base_s": 3, "backoff_max_s": 3},
    )
    directory = ckpt_dir(gateway_process, job.id)
    wait_for(lambda: committed(directory, 20), 120, "checkpoint 20")
    kill_all_ranks(job.id)
    wait_for(lambda: job.status() is JobState.RESTARTING, 30, "RESTARTING")
    newest = max(
        (
            int(p.name.split("-")[1])
            for p in directory.glob("step-*")
            if committed(directory, int(p.name.split("-")[1]))
        ),
    )
    target = directory / f"step-{newest}"
    if damage == "truncate a file":
        victim = next(target.glob("__*.distcp"))
        victim.write_bytes(victim.read_bytes()[:64])
    else:
        (target / "manifest.json").unlink()
    record = job.wait(timeout=240)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert job.attempts()[1].resumed_from_step == newest - 10
    if damage == "truncate a file":
        skips = [
            e
            for e in job.events(limit=10_000).events
            if e.type is EventType.CHECKPOINT and "skipped" in e.data
        ]
        assert skips and skips[0].data["step"] == newest
        assert "does not match its manifest" in skips[0].data["skipped"]
    assert no_processes_left(job.id)


SLOW_SAVE = """
import time
import torch
import air_sdk.runtime as air

ctx = air.init()
big = {"ballast": torch.zeros(192 << 20)}  # 768 MiB per rank: a save of seconds here
for step in range(1, 41):
    air.log(step=step, loss=1.0 / step)
    time.sleep(0.05)
    if step == 20:
        t = time.time()
        air.checkpoint.save(big, step=step, block=True)  # the loop waits until durable
        print(f"save took {time.time() - t:.1f} s", flush=True)
air.shutdown()
"""


def test_a_slow_checkpoint_save_is_not_a_hang(gateway, workdir):
    job = gateway.submit(
        JobSpec(
            entrypoint="train.py", resources=Resources(nodes=2), failure={"hang_timeout_s": 2.5}
        ),
        workdir=workdir(SLOW_SAVE),
    )
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, record.failure)
    took = [
        float(line.text.split()[2])
        for line in job.logs(rank=0)
        if line.text.startswith("save took")
    ]
    assert took and took[0] > 2.5  # the save really outlasted the hang timeout
