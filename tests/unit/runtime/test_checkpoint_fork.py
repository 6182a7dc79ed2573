"""air.checkpoint's fork snapshot: a copy-on-write child writes the checkpoint while the
trainer goes on. What is saved is the state of the moment save() was called, a child that
dies fails the save (and commits nothing), and the result is plain DCP: it loads across
world sizes. AIR_CHECKPOINT_SNAPSHOT picks the mode."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from airtest import run_in_own_session, torchrun_two_ranks
from test_runtime_checkpoint import FailingStorage, Recorder, make_state, params, train

torch = pytest.importorskip("torch")

from air_sdk.runtime import _dist, _fork_snapshot, checkpoint  # noqa: E402
from air_sdk.runtime._storage import FsspecStorage, LocalStorage  # noqa: E402
from air_sdk.runtime.checkpoint import Checkpointer, CheckpointError  # noqa: E402


class Shipper(Recorder):
    def heartbeat(self) -> None:  # a wait() of seconds beats (air_sdk.runtime._shipper)
        pass


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    for name in ("AIR_CHECKPOINT_DIR", "AIR_CHECKPOINT_KEEP", "RANK", "WORLD_SIZE", "AIR_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIR_CHECKPOINT_SNAPSHOT", "fork")
    monkeypatch.setattr(checkpoint, "_default", None)
    recorder = Shipper()
    monkeypatch.setattr("air_sdk.runtime._shipper.get_shipper", lambda: recorder)
    return recorder


def in_child(monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Run `action(rank)` in the forked writer before it writes."""
    monkeypatch.setattr(_fork_snapshot, "_child_hook", action)


def snapshot_of(ckpt: Checkpointer) -> str:
    pending = ckpt._pending
    assert pending is not None, "no save in flight"
    return pending.snapshot.name


def test_a_fork_save_round_trips_model_optimizer_data_position_and_values(
    tmp_path: Path, one_process: Recorder
) -> None:
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    train(state, 3)
    state["epoch"], state["best"] = 2, {"loss": 0.5}
    ckpt.save(state, step=30)
    assert snapshot_of(ckpt) == "fork"
    assert ckpt.wait() == 30
    saved, saved_optim = params(state["model"]), state["optim"].state_dict()

    fresh = make_state(seed=1)
    assert ckpt.load(fresh) == 30
    assert all(torch.equal(v, saved[k]) for k, v in params(fresh["model"]).items())
    got_optim = fresh["optim"].state_dict()
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(got_optim["state"][0][key], saved_optim["state"][0][key])
    assert fresh["data"].state_dict() == state["data"].state_dict()
    assert fresh["data"].state_dict()["index"] == 6
    assert fresh["epoch"] == 2 and fresh["best"] == {"loss": 0.5}
    names = sorted(p.name for p in (tmp_path / "step-30").iterdir())
    assert names == [".metadata", "__0_0.distcp", "manifest.json"]
    commit = one_process.records[0]
    assert commit["step"] == 30 and commit["num_files"] == 2
    assert 0 <= commit["blocked_s"] <= commit["durable_s"]


def test_an_optimizer_without_state_yet_is_saved_from_the_parent(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    state = make_state()  # no step taken: the optimizer state is created by save()
    ckpt.save(state, step=0, block=True)
    assert state["optim"].state  # created in this process, not only in the child
    fresh = make_state(seed=1)
    assert ckpt.load(fresh) == 0
    assert all(torch.equal(v, params(state["model"])[k]) for k, v in params(fresh["model"]).items())


def test_what_is_saved_is_the_state_at_the_moment_of_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_child(monkeypatch, lambda rank: time.sleep(0.5))  # the child writes late
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    train(state, 2)
    before, best = params(state["model"]), state["best"]
    ckpt.save(state, step=4)
    with torch.no_grad():  # the trainer goes on at once, in place
        for p in state["model"].parameters():
            p.add_(100.0)
    best["loss"] = -1.0
    train(state, 1)
    assert ckpt.latest() is None  # still being written
    assert ckpt.wait() == 4
    fresh = make_state(seed=9)
    ckpt.load(fresh)
    assert all(torch.equal(v, before[k]) for k, v in params(fresh["model"]).items())
    assert fresh["best"] == {"loss": 9.0}
    assert fresh["data"].state_dict()["index"] == 4


def test_a_killed_writer_fails_the_save_commits_nothing_and_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_process: Recorder
) -> None:
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    train(state, 1)
    ckpt.save(state, step=1, block=True)
    at_1 = params(state["model"])
    one_process.records.clear()

    in_child(monkeypatch, lambda rank: os.kill(os.getpid(), signal.SIGKILL))
    train(state, 1)
    ckpt.save(state, step=2)
    with pytest.raises(CheckpointError) as caught:
        ckpt.wait()
    message = str(caught.value)
    assert "step 2 was not committed" in message
    assert "rank 0" in message and "killed by signal 9 (SIGKILL)" in message
    assert not (tmp_path / "step-2" / "manifest.json").exists()
    assert one_process.records == []
    ckpt.save(state, step=1)  # the same step again: the committed copy is put back
    with pytest.raises(CheckpointError, match="SIGKILL"):
        ckpt.wait()
    in_child(monkeypatch, None)
    assert ckpt.latest() == 1
    fresh = make_state(seed=4)
    assert ckpt.load(fresh) == 1
    assert all(torch.equal(v, at_1[k]) for k, v in params(fresh["model"]).items())
    ckpt.save(state, step=3, block=True)  # and saving works again
    assert ckpt.latest() == 3


THREAD_ENDS = """
import sys, threading, time
import torch
from air_sdk.runtime import _fork_snapshot
from air_sdk.runtime.checkpoint import Checkpointer

_fork_snapshot._child_hook = lambda rank: time.sleep(30)  # still writing when it ends
ckpt = Checkpointer(sys.argv[1])
saver = threading.Thread(target=ckpt.save, args=({"model": torch.nn.Linear(3, 3)},),
                         kwargs={"step": 1}, name="saver")
saver.start()
saver.join()
try:
    ckpt.wait()
except Exception as exc:
    print(exc, flush=True)
print("latest", ckpt.latest(), flush=True)
"""


def run_script(tmp_path: Path, text: str) -> str:
    """`text` run as a fork-saving job's script in a process of its own (this one's
    threads hold whatever the tests before left); its output."""
    script = tmp_path / "script.py"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIR_")}
    env["AIR_CHECKPOINT_SNAPSHOT"] = "fork"
    return run_in_own_session(
        script,
        str(tmp_path / "ckpt"),
        env=env,
        timeout_s=120,
        on_hang="the fork save never finished",
    )


def test_a_writer_dies_with_the_thread_that_saved_and_the_save_says_so(tmp_path: Path) -> None:
    out = run_script(tmp_path, THREAD_ENDS)
    assert "killed by signal 9 (SIGKILL)" in out
    assert "the thread that called save (saver) ended before the write did" in out
    assert "latest None" in out


GONE_GROUPS = """
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
from air_sdk.runtime.checkpoint import Checkpointer


def train_under(layout):  # a process group made, trained on in this thread, destroyed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    layout(model, init_device_mesh("cpu", (1,)))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optim.zero_grad()
        F.mse_loss(model(torch.randn(4, 4)), torch.randn(4, 2)).backward()
        optim.step()
    dist.destroy_process_group()


train_under(lambda model, mesh: fully_shard(model, mesh=mesh))
train_under(lambda model, mesh: parallelize_module(model, mesh, {"0": ColwiseParallel()}))
ckpt = Checkpointer(sys.argv[1])
torch.manual_seed(5)
ckpt.save({"model": torch.nn.Linear(3, 3)}, step=1)
print("committed step", ckpt.wait(), flush=True)
"""


def test_a_fork_save_finishes_where_the_training_thread_kept_process_groups_that_are_gone(
    tmp_path: Path,
) -> None:
    """torch's per-thread DTensor cache keeps the device meshes, and so the process
    groups, of the ops this thread ran. A child forked by another thread had CPython
    clear this thread's state, whose gloo group's destructor then waited forever for
    worker threads the child does not have: the save never finished."""
    out = run_script(tmp_path, GONE_GROUPS)
    assert "committed step 1" in out
    torch.manual_seed(5)
    fresh = {"model": torch.nn.Linear(3, 3)}
    expected = {k: v.clone() for k, v in fresh["model"].state_dict().items()}
    with torch.no_grad():
        for p in fresh["model"].parameters():
            p.zero_()
    assert Checkpointer(tmp_path / "ckpt").load(fresh) == 1
    assert all(torch.equal(v, expected[k]) for k, v in fresh["model"].state_dict().items())


def test_a_failed_write_in_the_child_says_why(tmp_path: Path) -> None:
    failing = Checkpointer(storage=FailingStorage(tmp_path))
    failing.save(make_state(), step=7)
    assert snapshot_of(failing) == "fork"  # forced by the fixture, a custom storage or not
    with pytest.raises(CheckpointError, match=r"rank 0: .*No space left on device"):
        failing.wait()
    assert not (tmp_path / "step-7" / "manifest.json").exists()


def test_air_shutdown_waits_for_the_forked_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_dist, "_shut_down", False)
    in_child(monkeypatch, lambda rank: time.sleep(0.3))
    ckpt = Checkpointer(tmp_path)
    ckpt.save(make_state(), step=3)
    _dist.shutdown()
    assert (tmp_path / "step-3" / "manifest.json").exists()
    assert ckpt.wait() is None


def test_copy_mode_uses_dcp_async_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIR_CHECKPOINT_SNAPSHOT", "copy")
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    train(state, 1)
    ckpt.save(state, step=1)
    assert snapshot_of(ckpt) == "copy"
    assert ckpt.wait() == 1
    fresh = make_state(seed=2)
    assert ckpt.load(fresh) == 1
    assert all(torch.equal(v, params(state["model"])[k]) for k, v in params(fresh["model"]).items())


def test_an_unknown_snapshot_mode_names_the_allowed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIR_CHECKPOINT_SNAPSHOT", "bogus")
    with pytest.raises(CheckpointError, match="'bogus' is not one of copy, fork, auto"):
        Checkpointer(tmp_path).save(make_state(), step=1)
    assert not (tmp_path / "step-1").exists()


def test_copy_is_the_default_and_auto_forks_only_where_that_is_safe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIR_CHECKPOINT_SNAPSHOT")
    local = LocalStorage(tmp_path)
    ckpt = Checkpointer(storage=local)
    ckpt.save(make_state(), step=1)
    assert snapshot_of(ckpt) == "copy"  # the default: forking is asked for
    ckpt.wait()
    monkeypatch.setenv("AIR_CHECKPOINT_SNAPSHOT", "auto")
    ckpt.save(make_state(), step=2)
    assert snapshot_of(ckpt) == "fork"  # Linux, CPU tensors, local files
    ckpt.wait()

    plain = {"w": torch.zeros(3)}
    writer = local.writer(str(tmp_path / "x"))
    meta = {"w": torch.zeros(3, device="meta")}  # stands in for an accelerator's tensor
    assert _fork_snapshot.choose_mode("auto", plain, local, writer) == "fork"
    assert _fork_snapshot.choose_mode("auto", meta, local, writer) == "copy"
    with pytest.raises(CheckpointError, match="AIR_CHECKPOINT_SNAPSHOT=copy"):
        _fork_snapshot.choose_mode("fork", meta, local, writer)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _fork_snapshot.choose_mode("auto", plain, local, writer) == "copy"
    monkeypatch.undo()

    memory = FsspecStorage("memory://air-test-fork/run")
    in_memory = memory.writer("memory://air-test-fork/run/step-1")
    assert _fork_snapshot.choose_mode("auto", plain, memory, in_memory) == "copy"
    with pytest.raises(CheckpointError, match="in-memory"):
        _fork_snapshot.choose_mode("fork", plain, memory, in_memory)
    files = FsspecStorage(f"file://{tmp_path}")
    assert _fork_snapshot.choose_mode("auto", plain, files, files.writer(str(tmp_path))) == "fork"

    class Custom(LocalStorage):
        pass  # may hold in-process state a child cannot share

    assert _fork_snapshot.choose_mode("auto", plain, Custom(tmp_path), writer) == "copy"
    assert _fork_snapshot.choose_mode("fork", plain, Custom(tmp_path), writer) == "fork"


TWO_RANKS = """
import os, sys
import torch
import air_sdk.runtime as air
from air_sdk.runtime.checkpoint import Checkpointer

root = sys.argv[1]
air.init(timeout_s=60)
rank = torch.distributed.get_rank()


def one_step(model, optim, seed):
    torch.manual_seed(seed)
    optim.zero_grad()
    model(torch.randn(4, 6)).sum().backward()
    optim.step()


def fsdp2(seed):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def full(model):
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


# DDP: replicated tensors, each written once, spread over the ranks like DCP's dedup
torch.manual_seed(0)
ddp = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Linear(32, 3))
)
ddp_optim = torch.optim.AdamW(ddp.parameters(), lr=0.05)
one_step(ddp, ddp_optim, 1)
ckpt = Checkpointer(f"{root}/ddp")
ckpt.save({"model": ddp, "optim": ddp_optim, "rank_note": f"from {rank}"}, step=1)
print(f"rank {rank} ddp snapshot: {ckpt._pending.snapshot.name}", flush=True)
ckpt.wait()
if rank == 0:
    torch.save(ddp.module.state_dict(), f"{root}/ddp.pt")

# FSDP2: each rank writes its shards; the optimizer state comes back too
model, optim = fsdp2(0)
one_step(model, optim, 2)
ckpt = Checkpointer(f"{root}/fsdp")
ckpt.save({"model": model, "optim": optim}, step=1)
print(f"rank {rank} fsdp snapshot: {ckpt._pending.snapshot.name}", flush=True)
ckpt.wait()
other, other_optim = fsdp2(1)
Checkpointer(f"{root}/fsdp").load({"model": other, "optim": other_optim})
one_step(model, optim, 3)
one_step(other, other_optim, 3)
same = all(torch.equal(a, b) for a, b in zip(full(model).values(), full(other).values()))
print(f"rank {rank} fsdp resumed equal: {same}", flush=True)
model_at_1 = fsdp2(7)[0]
Checkpointer(f"{root}/fsdp").load({"model": model_at_1})
at_1 = full(model_at_1)  # a collective: every rank
if rank == 0:
    torch.save(at_1, f"{root}/fsdp.pt")

# one rank's checkpoint (saved by the test) into two FSDP2 shards
resharded = fsdp2(5)[0]
Checkpointer(f"{root}/single").load({"model": resharded})
whole = full(resharded)
if rank == 0:
    torch.save(whole, f"{root}/single-into-2.pt")
air.shutdown()
"""


def torchrun(tmp_path: Path, script: str, snapshot: str) -> str:
    path = tmp_path / "two_ranks.py"
    path.write_text(textwrap.dedent(script))
    return torchrun_two_ranks(path, str(tmp_path), AIR_CHECKPOINT_SNAPSHOT=snapshot)


@pytest.mark.slow
@pytest.mark.parametrize("snapshot", ["auto", "copy"])
def test_two_ranks_save_and_load_across_world_sizes(tmp_path: Path, snapshot: str) -> None:
    torch.manual_seed(11)
    single = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
    Checkpointer(tmp_path / "single").save({"model": single}, step=1, block=True)

    out = torchrun(tmp_path, TWO_RANKS, snapshot)
    used = "fork" if snapshot == "auto" else "copy"  # auto: CPU tensors and local files
    for rank in (0, 1):
        assert f"rank {rank} ddp snapshot: {used}" in out
        assert f"rank {rank} fsdp snapshot: {used}" in out
        assert f"rank {rank} fsdp resumed equal: True" in out

    ddp_dir = tmp_path / "ddp" / "step-1"
    assert sorted(p.name for p in ddp_dir.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "manifest.json",
    ]
    assert (ddp_dir / "__1_0.distcp").stat().st_size > 0  # rank 1 took its share
    fsdp_dir = tmp_path / "fsdp" / "step-1"
    assert (fsdp_dir / "__0_0.distcp").stat().st_size > 0
    assert (fsdp_dir / "__1_0.distcp").stat().st_size > 0

    # two ranks' checkpoints into one process without a process group
    ddp_model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Linear(32, 3))
    state: dict[str, Any] = {"model": ddp_model, "rank_note": None}
    assert Checkpointer(tmp_path / "ddp").load(state) == 1
    assert state["rank_note"] == "from 0"  # a plain value comes from rank 0
    expected = torch.load(tmp_path / "ddp.pt")
    assert all(torch.equal(v, expected[k]) for k, v in ddp_model.state_dict().items())

    one = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
    assert Checkpointer(tmp_path / "fsdp").load({"model": one}) == 1
    expected = torch.load(tmp_path / "fsdp.pt")
    assert all(torch.equal(v, expected[k]) for k, v in one.state_dict().items())

    resharded = torch.load(tmp_path / "single-into-2.pt")
    assert all(torch.equal(v, resharded[k]) for k, v in single.state_dict().items())


def test_the_writer_is_named_so_tools_can_tell_it_from_its_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    psutil = pytest.importorskip("psutil")
    seen: list[str] = []
    in_child(monkeypatch, lambda rank: time.sleep(1.0))
    ckpt = Checkpointer(tmp_path)
    ckpt.save(make_state(), step=1)
    pending = ckpt._pending
    assert pending is not None and pending.snapshot.name == "fork"
    pid = pending.snapshot.forked.pid
    assert pid
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _fork_snapshot.WRITER_NAME not in seen:
        seen.append(psutil.Process(pid).name())
        time.sleep(0.05)
    assert _fork_snapshot.WRITER_NAME in seen
    assert ckpt.wait() == 1


@pytest.mark.parametrize("mode", ["fork", "copy"])
def test_the_commit_record_names_the_snapshot_and_the_gateway_accepts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_process: Recorder, mode: str
) -> None:
    from air_sdk.schema.events import CheckpointCommit

    monkeypatch.setenv("AIR_CHECKPOINT_SNAPSHOT", mode)
    Checkpointer(tmp_path).save(make_state(), step=1, block=True)
    assert one_process.records[0]["snapshot"] == mode
    assert CheckpointCommit.model_validate(one_process.records[0]).snapshot == mode
