"""A `ShardedDataset` job killed mid-epoch and resumed by another job on another world
size, through a real gateway: 2 nodes resumed on 1, and 1 resumed on 2. Each rank
writes the ids of the samples each step received; the samples consumed up to the
checkpoint by the killed job plus those of the resumed job are exactly the epoch's
global order (computed here, in one process): no sample twice, none missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airtest import no_processes_left
from shard_files import SEQ_LEN, token_ids, token_shards

from air_sdk.client import Client, Job
from air_sdk.runtime.data import ShardedDataset, write_index
from air_sdk.schema import CheckpointSpec, JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

BATCH, SEED, BLOCK = 4, 11, 16
SAVED_AT, DIE_AT = 4, 5  # a blocking save at step 4; the last rank SIGKILLs itself as step 5 starts

TRAIN = """
import json, os, signal, sys
import torch
import torch.distributed as dist
import air_sdk.runtime as air

root, out, tag = sys.argv[1], sys.argv[2], sys.argv[3]
die_at, workers, seq_len = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
ctx = air.init()
data = air.data.ShardedDataset(root, seq_len=seq_len, seed=11, shuffle_block=16)
stream = air.data.loader(data, 4, num_workers=workers)
model = torch.nn.Linear(seq_len + 1, 1)
state = {"model": model, "data": stream}
step = air.checkpoint.load(state) or 0
print(f"rank {ctx.rank} of {ctx.world_size} resumes after step {step} at {stream.position}", flush=True)
with open(os.path.join(out, f"{tag}-rank{ctx.rank}.jsonl"), "a") as log:
    for batch in stream:  # the rest of epoch 0
        step += 1
        if die_at and step == die_at and ctx.rank == ctx.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        ids = [int(sample[0]) for sample in batch]
        log.write(json.dumps({"step": step, "ids": ids, "world": ctx.world_size}) + "\\n")
        log.flush()
        if dist.is_initialized():
            dist.all_reduce(torch.zeros(1))  # the ranks step together, as training does
        air.log(step=step, position=float(stream.position))
        if step % 2 == 0:
            air.checkpoint.save(state, step=step, block=True)
air.checkpoint.wait()
del model, state
air.shutdown()
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """60 token samples in 3 shards, and their global order for epoch 0."""
    root = token_shards(tmp_path_factory.mktemp("shards"))
    write_index(root)
    data = ShardedDataset(
        root, seq_len=SEQ_LEN, seed=SEED, shuffle_block=BLOCK, dp_rank=0, dp_size=1
    )
    return root, [token_ids(sample) for sample in data]


def run(
    gateway: Client, workdir: Path, data: Path, out: Path, ckpt: Path, nodes: int, *, tag: str,
    die_at: int = 0, workers: int = 0,
) -> Job:  # fmt: skip
    job = gateway.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(data), str(out), tag, str(die_at), str(workers), str(SEQ_LEN)],
            resources=Resources(nodes=nodes, procs_per_node=1),
            checkpoint=CheckpointSpec(dir=str(ckpt)),
            max_restarts=0,
        ),
        workdir=workdir,
    )
    job.wait(timeout=300)
    return job


def consumed(out: Path, tag: str, start: int, up_to: int | None = None) -> dict[int, int]:
    """{global position: sample id} of the steps a job's ranks received (up to a step)."""
    files = sorted(out.glob(f"{tag}-rank*.jsonl"))
    positions: dict[int, int] = {}
    for path in files:
        rank = int(path.stem.rsplit("rank", 1)[1])
        records = [json.loads(line) for line in path.read_text().splitlines()]
        taken = [i for r in records if up_to is None or r["step"] <= up_to for i in r["ids"]]
        world = records[0]["world"]
        assert len(files) == world
        for j, sample in enumerate(taken):
            position = start + rank + world * j
            assert position not in positions
            positions[position] = sample
    return positions


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)], ids=["2-to-1", "1-to-2"])
def test_a_killed_job_resumed_on_another_world_size_consumes_each_sample_once(
    gateway: Client,
    dataset: tuple[Path, list[int]],
    tmp_path: Path,
    before: int,
    after: int,
) -> None:
    data, order = dataset
    src, out, ckpt = tmp_path / "src", tmp_path / "out", tmp_path / "ckpt"
    src.mkdir()
    out.mkdir()
    (src / "train.py").write_text(TRAIN)

    killed = run(gateway, src, data, out, ckpt, before, tag="killed", die_at=DIE_AT, workers=1)
    assert killed.record().state is JobState.FAILED
    manifest = json.loads((ckpt / f"step-{SAVED_AT}" / "manifest.json").read_text())
    saved = manifest["data_position"]["data"]
    assert (saved["epoch"], saved["position"]) == (0, SAVED_AT * BATCH * before)

    resumed = run(
        gateway, src, data, out, ckpt, after, tag="resumed", workers=2 if after == 1 else 0
    )
    record = resumed.record()
    assert record.state is JobState.SUCCEEDED, (
        record.state_reason,
        [x.text for x in resumed.logs()][-20:],
    )
    assert resumed.attempts()[0].resumed_from_step == SAVED_AT
    assert f"rank 0 of {after} resumes after step {SAVED_AT} at {saved['position']}" in [
        line.text for line in resumed.logs(rank=0)
    ]

    head = consumed(out, "killed", 0, up_to=SAVED_AT)  # what the checkpoint holds
    assert sorted(head) == list(range(saved["position"]))
    tail = consumed(out, "resumed", saved["position"])
    union = {**head, **tail}
    assert len(union) == len(head) + len(tail)  # no position twice
    assert sorted(union) == list(range(len(order)))  # no gap: the whole epoch (60 divides by 2)
    assert [union[p] for p in sorted(union)] == order  # in the uninterrupted run's order
    assert sorted(union.values()) == sorted(set(order))  # so no sample twice
    assert no_processes_left(killed.id) and no_processes_left(resumed.id)
