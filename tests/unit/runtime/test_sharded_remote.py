"""`ShardedDataset` over a remote URL: the index is read where it lives, shards come
through the ShardStore's cache (fsspec's memory:// here), the samples are the local
directory's, and a shard whose bytes do not match its index is a clear error."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
from shard_files import SEQ_LEN, jsonl_shards, token_ids, token_shards

from air_sdk.errors import ConfigError, ShardChecksumError
from air_sdk.runtime.data import ShardedDataset, loader, write_index
from air_sdk.runtime.data.metrics import recorder

# DataLoader workers are forked from the test process: run before other tests (conftest.py)
pytestmark = pytest.mark.forks_workers


def _upload(local: Path, url: str) -> None:
    fs = fsspec.filesystem("memory")
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        name = path.relative_to(local).as_posix()
        fs.pipe_file(f"{url.removeprefix('memory://')}/{name}", path.read_bytes())


@pytest.fixture
def remote(tmp_path):
    local = token_shards(tmp_path / "local")
    write_index(local)
    url = f"memory://air-tests/{tmp_path.name}"
    _upload(local, url)
    yield local, url
    fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


def test_a_remote_dataset_reads_the_same_samples_through_the_cache(remote, tmp_path):
    local, url = remote
    kw = {"seq_len": SEQ_LEN, "seed": 3, "dp_rank": 0, "dp_size": 1}
    want = [token_ids(s) for s in ShardedDataset(local, **kw)]
    data = ShardedDataset(url, cache_dir=tmp_path / "cache", **kw)
    assert [token_ids(s) for s in data] == want
    stats = data._store.stats()
    # each shard downloaded once: the first by the reader, the others ahead of it
    assert (stats["misses"], stats["prefetched"]) == (1, len(data.index.shards) - 1)
    assert stats["bytes_downloaded"] == sum(shard.bytes for shard in data.index.shards)
    assert list((tmp_path / "cache").rglob("*.bin"))


def test_a_remote_shard_that_does_not_match_its_index_names_the_shard(remote, tmp_path):
    local, url = remote
    name = sorted(p.name for p in local.glob("*.bin"))[0]
    fs = fsspec.filesystem("memory")
    path = f"{url.removeprefix('memory://')}/{name}"
    data = bytearray(fs.cat_file(path))
    data[0] ^= 0xFF  # same size, other bytes
    fs.pipe_file(path, bytes(data))
    dataset = ShardedDataset(
        url, seq_len=SEQ_LEN, shuffle=False, dp_rank=0, dp_size=1, cache_dir=tmp_path / "c"
    )
    with pytest.raises(ShardChecksumError, match=name):
        list(dataset)


def test_a_remote_url_without_an_index_says_how_to_make_one(tmp_path):
    fsspec.filesystem("memory").pipe_file(f"air-tests/{tmp_path.name}-bare/a.bin", b"\0" * 64)
    with pytest.raises(ConfigError, match="has no index.json: run `air data index`"):
        ShardedDataset(f"memory://air-tests/{tmp_path.name}-bare", seq_len=4, cache_dir=tmp_path)


def _shipper_made_here(_sample: object) -> bool:
    from air_sdk.runtime import _shipper

    return _shipper._global is not None


def test_cache_hits_counted_in_workers_reach_the_training_process(remote, tmp_path):
    # The shards are pinned in the DataLoader's worker processes: their hits and misses
    # are the rank's, though the workers' own recorders die with them; and no worker
    # makes a report shipper of its own (its totals would replace the rank's).
    _local, url = remote
    data = ShardedDataset(
        url, seq_len=SEQ_LEN, dp_rank=0, dp_size=1, cache_dir=tmp_path / "cache",
        decode=_shipper_made_here,
    )  # fmt: skip
    before = recorder().totals()
    stream = loader(data, 4, num_workers=1, collate_fn=list)
    first = [made for batch in stream for made in batch]  # epoch 0: downloads, prefetches
    second = [made for batch in stream for made in batch]  # epoch 1: new workers, cached
    after = recorder().totals()
    shards = len(data.index.shards)
    misses = after["num_cache_misses"] - before["num_cache_misses"]
    hits = after["num_cache_hits"] - before["num_cache_hits"]
    assert hits + misses == 2 * shards  # every shard pinned once an epoch, all counted
    assert misses >= 1 and hits >= shards  # epoch 0's first shard; epoch 1 all cached
    assert len(first) == len(second) == data.num_samples and not any(first + second)


def test_remote_jsonl_shards_are_read_through_their_sample_tables(tmp_path):
    local = tmp_path / "local"
    written = jsonl_shards(local)
    index = write_index(local)
    url = f"memory://air-tests/{tmp_path.name}-jsonl"
    _upload(local, url)
    kw = {"shuffle": False, "dp_rank": 0, "dp_size": 1}
    data = ShardedDataset(url, cache_dir=tmp_path / "cache", **kw)
    assert list(data) == written
    fs = fsspec.filesystem("memory")
    table = f"{url.removeprefix('memory://')}/{index.shards[0].table}"
    fs.pipe_file(table, b"\x01" + fs.cat_file(table)[1:])  # same size, other bytes
    again = ShardedDataset(url, cache_dir=tmp_path / "cache2", **kw)
    with pytest.raises(ShardChecksumError, match=r"part-0\.jsonl\.offsets"):
        list(again)
    fs.rm(url.removeprefix("memory://"), recursive=True)
