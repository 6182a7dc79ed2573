"""A remote `ShardedDataset` downloads the next shards of the rank's share of the order in
the background while it reads the current one (fsspec's memory:// and a real HTTP server
on 127.0.0.1), within the cache budget, and a corrupt shard still names itself."""

from __future__ import annotations

import hashlib
from pathlib import Path

import fsspec
import pytest
from airtest import wait_for
from shard_files import SEQ_LEN, token_ids, token_shards
from shard_http import serve_files

from air_sdk.errors import ConfigError, DataError, ShardChecksumError
from air_sdk.runtime.data import ShardedDataset, write_index
from air_sdk.runtime.data._order import GlobalOrder
from air_sdk.runtime.data.metrics import recorder

# DataLoader workers are forked from the test process: run before other tests (conftest.py)
pytestmark = pytest.mark.forks_workers

SIZES = (6, 7, 5, 8, 6)  # samples of SEQ_LEN per shard: five shards, each ~100 bytes
KW = {"seq_len": SEQ_LEN, "dp_rank": 0, "dp_size": 1}


@pytest.fixture
def local(tmp_path: Path) -> Path:
    root = token_shards(tmp_path / "local", SIZES)
    write_index(root)
    return root


@pytest.fixture
def remote(local: Path, tmp_path: Path):
    fs = fsspec.filesystem("memory")
    prefix = f"air-tests/prefetch-{tmp_path.name}"
    for path in sorted(local.iterdir()):
        fs.pipe_file(f"{prefix}/{path.name}", path.read_bytes())
    yield f"memory://{prefix}"
    fs.rm(prefix, recursive=True)


def shard_names(local: Path) -> list[str]:
    return sorted(p.name for p in local.glob("*.bin"))


def cached(data: ShardedDataset) -> set[str]:
    cache = data._store.cache
    assert cache is not None
    return {entry.name for entry in cache.entries()}


def test_the_order_says_which_shards_a_rank_reads_next():
    order = GlobalOrder([4, 4, 4, 4], seed=1, epoch=0, shuffle=True, block=6)
    for stride, first in ((1, 0), (3, 2)):
        positions = range(first, order.num_samples, stride)
        read: list[int] = []
        for i in positions:  # the shards in the order this rank first reads them
            shard = order.locate(i)[0]
            if shard not in read:
                read.append(shard)
        # exact within the first block; after it, every shard of the later blocks
        ahead = order.shards_after(first, stride=stride, limit=4)
        assert sorted(ahead) == sorted(read)
        in_block = {order.locate(i)[0] for i in range(first, 6, stride)}
        assert ahead[: len(in_block)] == [s for s in read if s in in_block]
    plain = GlobalOrder([4, 0, 4, 4], seed=1, epoch=0, shuffle=False, block=6)
    assert plain.shards_after(3, limit=2) == [0, 2]  # the empty shard is never read
    assert plain.shards_after(12, limit=2) == []
    with pytest.raises(ValueError, match="limit and stride must be >= 1"):
        plain.shards_after(0, limit=0)


def test_the_next_shards_are_cached_before_the_reader_reaches_them(remote, local, tmp_path):
    want = [token_ids(s) for s in ShardedDataset(local, shuffle=False, **KW)]
    data = ShardedDataset(remote, shuffle=False, cache_dir=tmp_path / "c", **KW)
    assert data.prefetch_shards == 2
    before = recorder().totals()
    it = iter(data)
    got = [token_ids(next(it))]  # shard 0 is being read; shards 1 and 2 download meanwhile
    names = shard_names(local)
    wait_for(lambda: cached(data) == set(names[:3]), 30, "shards 1 and 2 prefetched")
    assert data.num_shard_opens == 1  # the reader is still in shard 0
    got += [token_ids(s) for s in it]
    assert got == want
    stats = data._store.stats()
    # only the first shard was downloaded by the reader; the others were prefetched, once
    assert (stats["misses"], stats["hits"], stats["prefetched"]) == (1, 4, 4)
    assert stats["bytes_downloaded"] == sum(p.stat().st_size for p in local.glob("*.bin"))
    after = recorder().totals()
    assert after["num_cache_misses"] - before["num_cache_misses"] == 1
    assert after["num_cache_hits"] - before["num_cache_hits"] == 4
    data.close()


def test_prefetch_keeps_to_the_cache_budget_and_never_evicts_a_shard_in_use(
    remote, local, tmp_path
):
    largest = max(p.stat().st_size for p in local.glob("*.bin"))
    budget = 2 * largest  # the shard read and one ahead
    kw = {**KW, "seed": 5, "shuffle_block": 9, "cache_dir": tmp_path / "c"}
    with pytest.raises(ConfigError, match="lower prefetch_shards to 1 or raise cache_budget"):
        ShardedDataset(remote, cache_budget_bytes=budget, prefetch_shards=2, **kw)
    for bad in ({"prefetch_shards": -1}, {"max_open_shards": 0}):
        with pytest.raises(ValueError, match="must be >= "):
            ShardedDataset(remote, **bad, **kw)
    small = {**kw, "cache_dir": tmp_path / "small", "prefetch_shards": 0}
    too_small = ShardedDataset(remote, cache_budget_bytes=largest - 1, **small)
    with pytest.raises(DataError, match="raise cache_budget_bytes above the largest shard"):
        list(too_small)  # the largest shard's own refusal, when it is reached
    want = [token_ids(s) for s in ShardedDataset(local, **{**kw, "cache_dir": None})]
    data = ShardedDataset(remote, cache_budget_bytes=budget, **kw)
    assert data.prefetch_shards == 1  # the default, bounded by the budget
    got = []
    for sample in data:
        got.append(token_ids(sample))
        assert data._store.stats()["bytes_cached"] <= budget
    assert got == want
    stats = data._store.stats()
    assert stats["evictions"] >= 3 and stats["prefetched"] >= 1
    data.close()


def test_a_corrupt_shard_fetched_ahead_names_itself_when_the_reader_reaches_it(local, tmp_path):
    pytest.importorskip("aiohttp")  # fsspec's HTTPFileSystem
    files = {p.name: p.read_bytes() for p in local.iterdir()}
    names = shard_names(local)
    bad = names[1]
    corrupt = bytearray(files[bad])
    corrupt[-1] ^= 0xFF  # same size, other bytes: only the checksum tells
    files[bad] = bytes(corrupt)
    with serve_files(files) as (url, handler):
        data = ShardedDataset(url, shuffle=False, cache_dir=tmp_path / "c", **KW)
        it = iter(data)
        next(it)
        wait_for(lambda: handler.gets[bad] == 1 and handler.gets[names[2]] == 1, 30, "prefetch")
        read = 1
        with pytest.raises(ShardChecksumError, match=rf"shard '{bad}' is corrupt") as caught:
            for _ in it:
                read += 1
        assert read == SIZES[0]  # every sample of shard 0, none of the corrupt one
        assert hashlib.sha256(files[bad]).hexdigest() in str(caught.value)
        assert handler.gets[bad] == 1  # the prefetch's error, not a second download
        assert all(handler.gets[name] == 1 for name in names[:3])
        data.close()


def test_dataloader_workers_prefetch_in_their_own_process(remote, local, tmp_path):
    """Forked workers start their own prefetch threads (the parent's, and the downloads
    they had under way, stay behind) and read the same batches as the local shards."""
    from air_sdk.runtime.data import loader

    kw = {**KW, "seed": 2, "shuffle_block": 7}
    want = [[token_ids(s) for s in b] for b in loader(ShardedDataset(local, **kw), 4)]
    data = ShardedDataset(remote, cache_dir=tmp_path / "c", **kw)
    next(iter(data))  # the parent reads too: its prefetch threads run when the workers fork
    data.load_state_dict({**data.state_dict(), "epoch": 0, "position": 0})
    stream = loader(data, 4, num_workers=2)
    assert [[token_ids(s) for s in b] for b in stream] == want
    assert cached(data) == set(shard_names(local))
    data.close()
