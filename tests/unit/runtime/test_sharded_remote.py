"""`ShardedDataset` over a remote URL: the index is read where it lives, shards come
through the ShardStore's cache (fsspec's memory:// here), the samples are the local
directory's, and a shard whose bytes do not match its index is a clear error."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
from shard_files import SEQ_LEN, token_ids, token_shards

from air_sdk.errors import ConfigError, ShardChecksumError
from air_sdk.runtime.data import ShardedDataset, write_index


def _upload(local: Path, url: str) -> None:
    fs = fsspec.filesystem("memory")
    for path in sorted(local.iterdir()):
        fs.pipe_file(f"{url.removeprefix('memory://')}/{path.name}", path.read_bytes())


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
