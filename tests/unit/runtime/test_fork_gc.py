"""What AIR forks (DataLoader workers of its loaders, the fork checkpoint writer) never
collects the parent's garbage (air_sdk.runtime._fork_gc). The garbage here is a gloo
process group whose last reference is a reference cycle (a trainer object that kept
its group, dropped after `destroy_process_group()`): freed in a forked child, its
destructor waits forever for worker threads the child does not have. The parent's
collector is kept off it and the child's collection is made certain (a collate_fn, or
the writer's test hook, calls `gc.collect()`); in a real job both are a matter of
timing (the suite's DataLoader workers hung so in two runs of three). Each case runs
in a process of its own, so a hang fails that process, not the suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from airtest import run_in_own_session

pytest.importorskip("torch")

# Everything imported first: imports allocate enough for a full collection, which
# would free the garbage in the parent before anything forks.
IMPORTS = """
import gc, pathlib, sys
import torch
import torch.distributed as dist
import air_sdk.runtime as air
from air_sdk.runtime import _fork_snapshot
from air_sdk.runtime.checkpoint import Checkpointer
from air_sdk.runtime.data import ShardedDataset, loader, write_index
from shard_files import SEQ_LEN, token_shards
"""

GARBAGE_GROUP = """

class Trainer:  # keeps its group; a bound method makes it a reference cycle
    def __init__(self):
        self.group = dist.group.WORLD
        self.on_step = self.step

    def step(self):
        pass


def collate(batch):  # runs in the worker process
    gc.collect()
    return torch.utils.data.default_collate(batch)


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
trainer = Trainer()
gc.collect()  # the trainer survives into the oldest generation
dist.destroy_process_group()
del trainer  # garbage now, which only a full collection frees
gc.disable()  # and the parent's collector does not get to it before the fork
"""

RESUMABLE = """
loader = air.resumable_loader(
    list(range(16)), batch_size=4, num_replicas=1, rank=0, num_workers=2, collate_fn=collate
)
for epoch in range(2):
    loader.set_epoch(epoch)
    print("epoch", epoch, sorted(x for b in loader for x in b.tolist()), flush=True)
"""

STREAM = """
root = token_shards(pathlib.Path(sys.argv[1]) / "tokens", sizes=(6, 6))
write_index(root)
stream = loader(
    ShardedDataset(root, seq_len=SEQ_LEN, seed=1, dp_rank=0, dp_size=1),
    4, num_workers=2, collate_fn=collate,
)
print("samples", sum(len(b) for b in stream), flush=True)
"""

FORK_SAVE = """
_fork_snapshot._child_hook = lambda rank: gc.collect()  # in the writer, before it writes
ckpt = Checkpointer(sys.argv[1] + "/ckpt")
ckpt.save({"model": torch.nn.Linear(3, 3)}, step=1)
print("committed step", ckpt.wait(), flush=True)
"""

FROZEN_BY_THE_USER = """
gc.freeze()  # the user's own, for copy-on-write; AIR must not undo it
loader = air.resumable_loader(list(range(8)), batch_size=4, num_replicas=1, rank=0, num_workers=2)
batches = len(list(loader))
print("batches", batches, "still frozen", gc.get_freeze_count() > 0, flush=True)  # unfrozen: 0
"""


def run_script(tmp_path: Path, text: str, **env: str) -> str:
    script = tmp_path / "script.py"
    script.write_text(text)
    tests = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIR_")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tests), environ.get("PYTHONPATH")]))
    return run_in_own_session(
        script,
        str(tmp_path),
        env={**environ, **env},
        timeout_s=90,
        on_hang="the forked process never finished (it collected the group?)",
    )


def test_resumable_loader_workers_leave_a_dead_gloo_group_to_the_parent(tmp_path: Path) -> None:
    out = run_script(tmp_path, IMPORTS + GARBAGE_GROUP + RESUMABLE)
    assert f"epoch 0 {list(range(16))}" in out
    assert f"epoch 1 {list(range(16))}" in out


def test_stream_loader_workers_leave_a_dead_gloo_group_to_the_parent(tmp_path: Path) -> None:
    out = run_script(tmp_path, IMPORTS + GARBAGE_GROUP + STREAM)
    assert "samples 12" in out


def test_the_fork_checkpoint_writer_leaves_a_dead_gloo_group_to_the_parent(
    tmp_path: Path,
) -> None:
    out = run_script(tmp_path, IMPORTS + GARBAGE_GROUP + FORK_SAVE, AIR_CHECKPOINT_SNAPSHOT="fork")
    assert "committed step 1" in out
    assert (tmp_path / "ckpt" / "step-1" / "manifest.json").exists()


def test_a_process_that_froze_its_objects_itself_keeps_them_frozen(tmp_path: Path) -> None:
    out = run_script(tmp_path, IMPORTS + FROZEN_BY_THE_USER)
    assert "batches 2 still frozen True" in out
