"""The global order of a `ShardedDataset` is a function of (seed, epoch) only: ranks and
DataLoader workers of any number, together, read exactly that sequence; the tp, cp and pp
ranks of one replica read the same samples (simulated layouts here, real gloo ranks
under torchrun in the slow test)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from airtest import torchrun_ranks
from shard_files import SEQ_LEN, SIZES, token_ids, token_shards

from air_sdk.errors import ConfigError
from air_sdk.runtime.data import ShardedDataset, loader, write_index

# DataLoader workers are forked from the test process: run before other tests (conftest.py)
pytestmark = pytest.mark.forks_workers

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[3]
BLOCK = 10  # smaller than a shard: the window property below is visible


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = token_shards(tmp_path_factory.mktemp("tokens"))
    write_index(root)
    return root


def dataset(root: Path, **kwargs: object) -> ShardedDataset:
    options: dict[str, object] = {"seq_len": SEQ_LEN, "shuffle_block": BLOCK, "seed": 3}
    options.update(kwargs)
    return ShardedDataset(root, **options)  # type: ignore[arg-type]


def the_order(root: Path, epoch: int = 0, **kwargs: object) -> list[int]:
    data = dataset(root, dp_rank=0, dp_size=1, **kwargs)
    data.set_epoch(epoch)
    return [token_ids(s) for s in data]


def interleaved(per_rank: list[list[int]]) -> list[int]:
    """Global positions from the ranks' streams: rank r's j-th sample is position r + D j."""
    size = len(per_rank)
    assert len({len(ids) for ids in per_rank}) == 1  # every rank takes as many steps
    return [per_rank[p % size][p // size] for p in range(size * len(per_rank[0]))]


def test_an_epoch_is_a_permutation_fixed_by_seed_and_epoch(shards: Path) -> None:
    first = the_order(shards)
    every = sorted(s * 10000 + k * SEQ_LEN for s, n in enumerate(SIZES) for k in range(n))
    assert sorted(first) == every and first != every  # all samples, shuffled
    assert the_order(shards) == first
    assert the_order(shards, epoch=1) != first
    assert sorted(the_order(shards, epoch=1)) == every
    assert the_order(shards, seed=4) != first
    assert the_order(shards, shuffle=False) == every


def test_each_block_of_the_order_reads_a_bounded_window_of_shards(shards: Path) -> None:
    # Shards shuffled, then blocks of BLOCK samples shuffled: a block's samples come from
    # the (at most ceil(BLOCK / smallest shard) + 1) shards its span of the concatenation covers.
    data = dataset(shards, dp_rank=0, dp_size=1)
    located = [data.locate(i) for i in range(data.num_samples)]
    for start in range(0, data.num_samples, BLOCK):
        assert len({name for name, _ in located[start : start + BLOCK]}) <= 2
    # and within a shard, samples are not read in their stored order
    assert [k for name, k in located if name == located[0][0]] != sorted(
        k for name, k in located if name == located[0][0]
    )


@pytest.mark.parametrize("dp_size", [1, 2, 4])
def test_ranks_together_read_the_one_global_order(shards: Path, dp_size: int) -> None:
    per_rank = [
        [token_ids(s) for s in dataset(shards, dp_rank=r, dp_size=dp_size)] for r in range(dp_size)
    ]
    order = the_order(shards)
    merged = interleaved(per_rank)
    assert merged == order[: len(merged)]
    assert len(order) - len(merged) < dp_size  # only the epoch's last < dp_size are dropped


@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("dp_size", [1, 2, 4])
def test_workers_of_every_rank_keep_the_global_order(
    shards: Path, dp_size: int, num_workers: int
) -> None:
    per_rank = []
    for rank in range(dp_size):
        stream = loader(dataset(shards, dp_rank=rank, dp_size=dp_size), 3, num_workers=num_workers)
        per_rank.append([token_ids(sample) for batch in stream for sample in batch])
    merged = interleaved(per_rank)
    assert merged == the_order(shards)[: len(merged)]


def test_a_plain_dataloader_with_workers_is_refused_with_the_loader_to_use(shards: Path) -> None:
    plain = torch.utils.data.DataLoader(
        dataset(shards, dp_rank=0, dp_size=1), batch_size=2, num_workers=1
    )
    with pytest.raises(
        Exception, match=r"air\.data\.loader\(dataset, batch_size=\.\.\., num_workers"
    ):
        next(iter(plain))


LAYOUTS = {"tp": ('{"tp": 2}', [(0, 1), (2, 3)]), "pp": ('{"pp": 2}', [(0, 2), (1, 3)])}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_ranks_of_one_replica_read_the_same_samples(
    shards: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    layout, replicas = LAYOUTS[name]
    order = the_order(shards)
    monkeypatch.setenv("AIR_PARALLELISM", layout)
    monkeypatch.setenv("WORLD_SIZE", "4")
    read: dict[int, list[int]] = {}
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        data = dataset(shards)  # dp_rank / dp_size from air.layout()
        assert data.dp_size == 2
        read[rank] = [token_ids(s) for s in data]
    for a, b in replicas:
        assert read[a] == read[b]
    assert interleaved([read[replicas[0][0]], read[replicas[1][0]]]) == order[: 2 * len(read[0])]
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(
        ConfigError, match="the tp, cp and pp ranks of one replica must read the same batch"
    ):
        dataset(shards, dp_rank=1, dp_size=4)  # the global rank, not the data-parallel one


REAL_RANKS = """
import datetime, itertools, json, os, sys
import torch.distributed as dist
import air_sdk.runtime as air

root, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
found = {}
for name, layout, steps in (("dp4", "{}", 3), ("tp2xfsdp2", '{"tp": 2}', 3), ("pp2", '{"pp": 2}', 3),
                            ("pp4", '{"pp": 4, "dp_shard": 1}', 2)):
    os.environ["AIR_PARALLELISM"] = layout
    data = air.data.ShardedDataset(root, seq_len=int(sys.argv[3]), shuffle_block=10, seed=3)
    stream = air.data.loader(data, 2, num_workers=1 if name == "dp4" else 0)
    if name == "dp4" and rank == 3:
        steps -= 1  # a rank behind: the checkpoint takes the smallest position
    if name == "pp4" and rank in (1, 2):
        steps = 0  # middle stages read nothing and do not hold the position back
    batches = []
    for batch in itertools.islice(stream, steps):  # takes exactly `steps` batches
        batches.append([int(sample[0]) for sample in batch])
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, batches)
    found[name] = {"batches": gathered, "dp": [data.dp_rank, data.dp_size], "state": stream.state_dict()}
if rank == 0:
    with open(out, "w") as f:
        json.dump(found, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_real_gloo_ranks_split_by_the_layout_and_agree_on_the_position(
    shards: Path, tmp_path: Path
) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(REAL_RANKS))
    torchrun_ranks(4, script, str(shards), str(tmp_path / "out.json"), str(SEQ_LEN))
    found = json.loads((tmp_path / "out.json").read_text())
    order = the_order(shards)

    dp4 = found["dp4"]["batches"]
    full = [[x for b in dp4[r][:2] for x in b] for r in range(4)]  # the steps all 4 took
    assert interleaved(full) == order[:16]
    assert found["dp4"]["state"]["position"] == 2 * 2 * 4  # rank 3 took one step less

    tp = found["tp2xfsdp2"]["batches"]
    assert tp[0] == tp[1] and tp[2] == tp[3] and tp[0] != tp[2]
    pp = found["pp2"]["batches"]
    assert pp[0] == pp[2] and pp[1] == pp[3] and pp[0] != pp[1]
    for name in ("tp2xfsdp2", "pp2"):
        assert found[name]["state"]["position"] == 3 * 2 * 2
    pp4 = found["pp4"]["batches"]
    assert pp4[0] == pp4[3] and pp4[1] == pp4[2] == []
    assert [x for b in pp4[0] for x in b] == order[:4]
    assert found["pp4"]["state"]["position"] == 2 * 2  # the middle stages did not count


def test_a_worker_that_crashes_in_native_code_prints_where(shards: Path) -> None:
    # torch's own worker handler says only "Unexpected segmentation fault encountered in
    # worker"; the loader's workers print the Python stack first. The user's own
    # worker_init_fn still runs (its tag reaches the samples). In a child process.
    code = textwrap.dedent(
        f"""
        import ctypes, os
        from air_sdk.runtime.data import ShardedDataset, loader

        def tag(worker_id):
            os.environ["TAG"] = f"worker-{{worker_id}}"

        def decode(view):
            if int(view[0]) == 10016:  # one sample of shard 1
                ctypes.string_at(0)
            return os.environ["TAG"]

        data = ShardedDataset({str(shards)!r}, seq_len={SEQ_LEN}, shuffle=False, dp_rank=0,
                              dp_size=1, decode=decode)
        stream = loader(data, 4, num_workers=1, worker_init_fn=tag, collate_fn=list)
        print(next(iter(stream)), flush=True)
        list(stream)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "['worker-0', 'worker-0', 'worker-0', 'worker-0']" in done.stdout
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "line 10 in decode" in done.stderr, done.stderr  # the user's line that crashed
    assert "exited unexpectedly" in done.stderr  # and the loop is still told
