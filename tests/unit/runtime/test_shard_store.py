"""ShardStore: remote shards through fsspec (memory:// and a real HTTP server on
127.0.0.1) behind a local cache with a byte budget; local directories read in place."""

from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import threading
import uuid
from collections.abc import Iterator

import fsspec
import pytest
from shard_http import ShardFiles, serve_files

from air_sdk.errors import DataError, ShardChecksumError
from air_sdk.runtime.data import ShardStore
from air_sdk.runtime.data.metrics import recorder


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SHARDS = {f"s{i}.bin": bytes([i]) * 100 for i in range(5)}


@pytest.fixture
def memory_url() -> Iterator[str]:
    """A fresh memory:// prefix holding SHARDS (fsspec's MemoryFileSystem is global)."""
    fs = fsspec.filesystem("memory")
    prefix = f"/air-test-{uuid.uuid4().hex}"
    for name, data in SHARDS.items():
        fs.pipe(f"{prefix}/{name}", data)
    yield f"memory://{prefix}"
    fs.rm(prefix, recursive=True)


def cached(store: ShardStore) -> set[str]:
    assert store.cache is not None
    return {entry.name for entry in store.cache.entries()}


def pin(store: ShardStore, name: str) -> bytes:
    with store.pinned(name, sha256=sha(SHARDS[name])) as path:
        return path.read_bytes()


# -- memory:// ----------------------------------------------------------------------------


def test_a_remote_shard_is_downloaded_once_then_served_from_the_cache(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path)
    assert pin(store, "s1.bin") == SHARDS["s1.bin"]
    assert pin(store, "s1.bin") == SHARDS["s1.bin"]
    assert pin(store, "s2.bin") == SHARDS["s2.bin"]
    stats = store.stats()
    assert (stats["hits"], stats["misses"]) == (1, 2)
    assert stats["bytes_downloaded"] == 200
    assert stats["bytes_cached"] == 200
    assert stats["wait_s"] > 0  # the two misses waited for their downloads
    with store.pinned("s1.bin") as path:
        assert path.is_relative_to(tmp_path)


def test_the_least_recently_used_shard_is_evicted_first(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path, cache_budget_bytes=300)
    for name in ("s0.bin", "s1.bin", "s2.bin", "s0.bin"):  # s0 used again: s1 is oldest
        pin(store, name)
    pin(store, "s3.bin")
    assert cached(store) == {"s0.bin", "s2.bin", "s3.bin"}
    pin(store, "s4.bin")
    assert cached(store) == {"s0.bin", "s3.bin", "s4.bin"}
    stats = store.stats()
    assert stats["evictions"] == 2
    assert stats["bytes_cached"] <= 300
    pin(store, "s1.bin")  # evicted: fetched again
    assert store.stats()["misses"] == 6


def test_a_pinned_shard_is_never_evicted(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path, cache_budget_bytes=200)
    with store.pinned("s0.bin") as held:
        pin(store, "s1.bin")
        pin(store, "s2.bin")  # s0 is the oldest, but in use: s1 goes
        assert cached(store) == {"s0.bin", "s2.bin"}
        assert held.read_bytes() == SHARDS["s0.bin"]
        with store.pinned("s2.bin"), pytest.raises(DataError) as info:
            pin(store, "s3.bin")  # both cached shards in use: no room
    assert "cannot hold shard 's3.bin'" in str(info.value)
    assert "raise cache_budget_bytes" in str(info.value)
    assert cached(store) == {"s0.bin", "s2.bin"}
    pin(store, "s3.bin")  # released: now it fits
    assert "s3.bin" in cached(store)


def test_a_shard_larger_than_the_budget_is_refused_before_it_is_downloaded(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path, cache_budget_bytes=64)
    with pytest.raises(DataError) as info:
        pin(store, "s0.bin")
    message = str(info.value)
    assert "'s0.bin' is 100 B (100 bytes)" in message
    assert "the cache budget is 64 B (64 bytes): raise cache_budget_bytes" in message
    assert store.stats()["bytes_downloaded"] == 0
    assert cached(store) == set()


def test_a_corrupt_shard_names_the_shard_both_checksums_and_the_url(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path)
    wrong = sha(b"what the index was built from")
    with pytest.raises(ShardChecksumError) as info, store.pinned("s3.bin", sha256=wrong):
        pass
    message = str(info.value)
    assert "shard 's3.bin' is corrupt" in message
    assert f"its sha256 is {sha(SHARDS['s3.bin'])}" in message
    assert f"the index expects {wrong}" in message
    assert f"{memory_url}/s3.bin" in message
    assert cached(store) == set()
    assert store.cache is not None and list(store.cache.tmp.iterdir()) == []


def test_a_cached_shard_with_another_checksum_is_fetched_again(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path)
    pin(store, "s1.bin")
    fsspec.filesystem("memory").pipe(memory_url.removeprefix("memory://") + "/s1.bin", b"new")
    with store.pinned("s1.bin", sha256=sha(b"new")) as path:
        assert path.read_bytes() == b"new"
    assert store.stats()["misses"] == 2


def test_concurrent_pins_from_threads_download_once(memory_url, tmp_path):
    stores = [ShardStore(memory_url, cache_dir=tmp_path) for _ in range(2)]  # two "processes"
    barrier = threading.Barrier(8)

    def read(i: int) -> bytes:
        barrier.wait()
        return pin(stores[i % 2], "s4.bin")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert set(pool.map(read, range(8))) == {SHARDS["s4.bin"]}
    stats = [s.stats() for s in stores]
    assert sum(s["misses"] for s in stats) == 1
    assert sum(s["hits"] for s in stats) == 7
    assert sum(s["bytes_downloaded"] for s in stats) == 100


def test_prefetch_fills_the_cache_in_the_background(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path, prefetch=2)
    names = ["s0.bin", "s1.bin", "s2.bin"]
    futures = store.prefetch(names, checksums={n: sha(SHARDS[n]) for n in names})
    assert len(futures) == 3
    concurrent.futures.wait(futures)
    assert [f.exception() for f in futures] == [None, None, None]
    assert cached(store) == set(names)
    assert store.prefetch(names) == []  # cached already: nothing started
    for name in names:
        pin(store, name)
    stats = store.stats()
    assert (stats["hits"], stats["misses"], stats["prefetched"]) == (3, 0, 3)
    store.close()


def test_prefetch_never_exceeds_the_budget(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path, cache_budget_bytes=200, prefetch=1)
    with store.pinned("s0.bin"), store.pinned("s1.bin"):
        concurrent.futures.wait(store.prefetch(["s2.bin", "s3.bin"]))
        assert cached(store) == {"s0.bin", "s1.bin"}
        assert store.stats()["prefetch_skipped"] == 2
    store.close()


def test_pins_count_as_cache_hits_and_misses_in_the_data_metrics(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path)
    before = recorder().totals()
    pin(store, "s2.bin")
    pin(store, "s2.bin")
    after = recorder().totals()
    assert after["num_cache_misses"] - before["num_cache_misses"] == 1
    assert after["num_cache_hits"] - before["num_cache_hits"] == 1


def test_bad_names_and_settings_say_what_to_change(memory_url, tmp_path):
    store = ShardStore(memory_url, cache_dir=tmp_path)
    for name in ("../etc/passwd", "/abs.bin", ""):
        with pytest.raises(DataError, match="must be a relative path"), store.pinned(name):
            pass
    with (
        pytest.raises(DataError, match=r"'nope.bin' is not at memory://.*/nope.bin"),
        store.pinned("nope.bin"),
    ):
        pass
    with pytest.raises(DataError, match="pass a positive byte count"):
        ShardStore(memory_url, cache_budget_bytes=0)
    with pytest.raises(DataError, match="does not exist"):
        ShardStore(tmp_path / "missing")


# -- local directories --------------------------------------------------------------------


def test_a_local_directory_is_read_in_place(tmp_path):
    (tmp_path / "sub").mkdir()
    shard = tmp_path / "sub" / "a.bin"
    shard.write_bytes(b"local")
    for url in (tmp_path, f"file://{tmp_path}"):
        store = ShardStore(url)
        with store.pinned("sub/a.bin", sha256=sha(b"other")) as path:  # verify is off
            assert path == shard
        assert store.cache is None and store.prefetch(["sub/a.bin"]) == []
    checked = ShardStore(tmp_path, verify=True)
    with (
        pytest.raises(ShardChecksumError, match="shard 'sub/a.bin' is corrupt"),
        checked.pinned("sub/a.bin", sha256=sha(b"other")),
    ):
        pass
    with checked.pinned("sub/a.bin", sha256=sha(b"local")) as path:
        assert path == shard


# -- a real HTTP server -------------------------------------------------------------------


@pytest.fixture
def http_server() -> Iterator[tuple[str, type[ShardFiles]]]:
    """A real HTTP server on 127.0.0.1 serving SHARDS; its handler class counts GETs."""
    pytest.importorskip("aiohttp")  # fsspec's HTTPFileSystem
    with serve_files(SHARDS) as served:
        yield served


def test_shards_over_http_are_cached_and_evicted(http_server, tmp_path):
    url, handler = http_server
    store = ShardStore(url, cache_dir=tmp_path, cache_budget_bytes=200)
    for name in ("s0.bin", "s1.bin", "s0.bin", "s2.bin"):
        assert pin(store, name) == SHARDS[name]
    assert cached(store) == {"s0.bin", "s2.bin"}
    stats = store.stats()
    assert (stats["hits"], stats["misses"], stats["evictions"]) == (1, 3, 1)
    assert handler.gets["s0.bin"] == 1
    with (
        pytest.raises(ShardChecksumError, match=rf"read from {url}/s3.bin"),
        store.pinned("s3.bin", sha256=sha(b"x")),
    ):
        pass
    with (
        pytest.raises(DataError, match=rf"'missing.bin' is not at {url}/missing.bin"),
        store.pinned("missing.bin"),
    ):
        pass


def _pin_in_process(url: str, cache_dir: str, name: str, out: multiprocessing.Queue) -> None:
    store = ShardStore(url, cache_dir=cache_dir)
    with store.pinned(name, sha256=sha(SHARDS[name])) as path:
        out.put((path.read_bytes(), store.stats()["misses"]))


def test_processes_on_one_node_download_a_shard_once(http_server, tmp_path):
    url, handler = http_server
    handler.delay_s = 0.3
    ctx = multiprocessing.get_context("fork")  # as DataLoader workers start
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_pin_in_process, args=(url, str(tmp_path), "s3.bin", out))
        for _ in range(3)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(60)
    assert [data for data, _ in results] == [SHARDS["s3.bin"]] * 3
    assert sorted(misses for _, misses in results) == [0, 0, 1]
    assert handler.gets["s3.bin"] == 1
