"""Reading sample k of one shard, per format, with one seek (the index says where).

A raw sample is what `decode` receives:

* tokens: a read-only numpy view of `seq_len + 1` tokens of the memory-mapped shard
  (inputs `[:-1]`, targets `[1:]`), no copy; sample k starts at token `k * seq_len`,
  so consecutive samples share one token and a shard of n tokens holds
  `(n - 1) // seq_len` samples (the tail is dropped, samples never cross shards);
* jsonl: the line's bytes;
* tar: `{"__key__": key, ext: bytes, ...}`.

The default decoders turn tokens into an int64 tensor (what an embedding takes; the
one copy of the sample), parse a JSONL line with `json.loads`, and leave a tar
sample's bytes as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from air_sdk.errors import ConfigError
from air_sdk.runtime.data._index import DataIndex, ShardEntry, load_table

__all__ = ["ShardReader", "default_decode", "open_shard", "samples_per_shard"]


class ShardReader(Protocol):
    def read(self, k: int) -> Any: ...

    def close(self) -> None: ...


def samples_per_shard(index: DataIndex, seq_len: int | None) -> list[int]:
    """How many samples each shard holds (for tokens: sequences of `seq_len`)."""
    if index.format == "tokens":
        assert seq_len is not None
        return [max(shard.num_samples - 1, 0) // seq_len for shard in index.shards]
    return [shard.num_samples for shard in index.shards]


class _Tokens:
    def __init__(self, path: Path, entry: ShardEntry, dtype: str, seq_len: int) -> None:
        self.seq_len = seq_len
        self.tokens = np.memmap(
            path, dtype=dtype, mode="r", offset=entry.header_bytes, shape=(entry.num_samples,)
        )

    def read(self, k: int) -> np.ndarray:
        start = k * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def close(self) -> None:
        # Drop the reference only: the mapping goes when its last view does. Closing the
        # mmap itself would unmap it under the views a decode handed out (numpy keeps no
        # buffer export, so mmap.close() succeeds) and reading one would crash the process.
        del self.tokens


class _Seekable:
    def __init__(self, path: Path, entry: ShardEntry, table: Path | None) -> None:
        self.entry = entry
        if table is None:
            raise ConfigError(
                f"the index lists no sample table for {entry.name}: run `air data index` again"
            )
        self.table = load_table(entry, table)
        self.file: BinaryIO = path.open("rb")

    def _bytes(self, offset: int, size: int) -> bytes:
        self.file.seek(offset)
        data = self.file.read(size)
        if len(data) != size:
            raise OSError(f"{self.entry.name} ended early: run `air data index` again")
        return data

    def close(self) -> None:
        self.file.close()


class _Jsonl(_Seekable):
    def read(self, k: int) -> bytes:
        start, end = int(self.table[k]), int(self.table[k + 1])
        return self._bytes(start, end - start)


class _Tar(_Seekable):
    def read(self, k: int) -> dict[str, Any]:
        sample = self.table[k]
        out: dict[str, Any] = {"__key__": sample.key}
        for ext, (offset, size) in sample.members.items():
            out[ext] = self._bytes(offset, size)
        return out


def open_shard(
    index: DataIndex, entry: ShardEntry, path: Path, seq_len: int | None, table: Path | None
) -> ShardReader:
    """A reader of `entry`, whose file is at `path` (its sample table at `table`)."""
    if index.format == "tokens":
        assert seq_len is not None and index.dtype is not None
        return _Tokens(path, entry, index.dtype, seq_len)
    if index.format == "jsonl":
        return _Jsonl(path, entry, table)
    return _Tar(path, entry, table)


def _tokens_to_tensor(view: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(view.astype(np.int64))


def _identity(sample: Any) -> Any:
    return sample


def default_decode(format: str) -> Any:
    """The decoder used when `decode=None`."""
    if format == "tokens":
        return _tokens_to_tensor
    if format == "jsonl":
        return json.loads
    return _identity
