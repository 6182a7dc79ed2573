"""Streaming data: `air.data.ShardedDataset` against a plain DataLoader over a memmap
dataset and, where it installs, MosaicML Streaming, on the same uint16 token shards.

    .venv/bin/python benchmarks/data.py                 # ~2 GB of tokens, 3 rounds
    .venv/bin/python benchmarks/data.py --gb 0.2 --rounds 1 --batches 50   # a smoke run

Measured, interleaved round by round (AIR, peer, AIR, peer ...), medians quoted:

- samples/s reading shuffled batches of `--seq-len` tokens with `--workers` DataLoader
  workers: `air.data.loader(ShardedDataset(...))` against `DataLoader(MemmapTokens,
  shuffle=True)` (random samples of one memmap per shard, the usual nanoGPT-style
  map-style dataset), and Streaming's `StreamingDataset` (`py1b` shuffle, as AIR's)
  over the same samples written as MDS, run in `--streaming-python` (a separate venv:
  Streaming does not install beside torch 2.13 CPU; `_streaming_peer.py`);
- time to the first batch after resuming at global position `--resume-at` (10^8
  samples of `--resume-seq-len` tokens, the same shards read with shorter samples),
  against iterating to skip (measured over `--skip-probe` samples and extrapolated,
  said so);
- time to the first sample resuming at the last sample of the `--seq-len` data, AIR
  against Streaming (`load_state_dict(sample_in_epoch=...)`), with `--streaming-python`;
- peak memory of the process and its workers (the sum of their PSS).

Nothing here is a test; results go to benchmarks/results/data.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import header, markdown_table, median, write_result
from _loading import read_rate
from torch.utils.data import DataLoader, Dataset

from air_sdk.runtime.data import ShardedDataset, loader, write_index

SHARD_TOKENS = 100_000_000  # 200 MB of uint16 per shard


def make_shards(root: Path, gb: float) -> int:
    """uint16 tokens (a fixed pseudo-random stream) in shards of SHARD_TOKENS; returns
    the number of tokens."""
    total = int(gb * 1e9 / 2)
    rng = np.random.default_rng(0)
    written, s = 0, 0
    while written < total:
        n = min(SHARD_TOKENS, total - written)
        rng.integers(0, 50_000, n, dtype=np.uint16).tofile(root / f"tokens-{s:04d}.bin")
        written += n
        s += 1
    write_index(root)
    return total


class MemmapTokens(Dataset[torch.Tensor]):
    """The peer: samples of seq_len + 1 tokens from one memmap per shard."""

    def __init__(self, root: Path, seq_len: int) -> None:
        self.files = sorted(root.glob("*.bin"))
        self.seq_len = seq_len
        self.maps: list[np.memmap] | None = None
        sizes = [f.stat().st_size // 2 for f in self.files]
        self.counts = [(n - 1) // seq_len for n in sizes]
        self.starts = np.cumsum([0, *self.counts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.maps is None:  # opened in each worker
            self.maps = [np.memmap(f, dtype=np.uint16, mode="r") for f in self.files]
        s = int(np.searchsorted(self.starts, i, side="right") - 1)
        k = i - int(self.starts[s])
        chunk = self.maps[s][k * self.seq_len : (k + 1) * self.seq_len + 1]
        return torch.from_numpy(chunk.astype(np.int64))


def air_batches(root: Path, args: argparse.Namespace) -> Any:
    data = ShardedDataset(root, seq_len=args.seq_len, seed=1, dp_rank=0, dp_size=1)
    return loader(data, args.batch_size, num_workers=args.workers)


def memmap_batches(root: Path, args: argparse.Namespace) -> Any:
    data = MemmapTokens(root, args.seq_len)
    generator = torch.Generator().manual_seed(1)
    return DataLoader(
        data, args.batch_size, shuffle=True, num_workers=args.workers, generator=generator
    )


def streaming(python: str, *args: object) -> dict[str, Any]:
    """One run of `_streaming_peer.py` in Streaming's interpreter (its JSON line)."""
    script = Path(__file__).with_name("_streaming_peer.py")
    run = subprocess.run(
        [python, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(script.parent)},
    )
    if run.returncode != 0:
        raise RuntimeError(f"{script.name} {args[0]} failed: {run.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def air_resume_s(root: Path, seq_len: int, position: int) -> float:
    """Seconds from a fresh dataset loading `position` to its first sample."""
    data = ShardedDataset(root, seq_len=seq_len, seed=1, dp_rank=0, dp_size=1)
    state = {**data.state_dict(), "position": position}
    start = time.perf_counter()
    resumed = ShardedDataset(root, seq_len=seq_len, seed=1, dp_rank=0, dp_size=1)
    resumed.load_state_dict(state)
    next(iter(resumed))
    return time.perf_counter() - start


def resume_times(root: Path, args: argparse.Namespace) -> dict[str, float]:
    data = ShardedDataset(root, seq_len=args.resume_seq_len, seed=1, dp_rank=0, dp_size=1)
    position = min(args.resume_at, data.num_samples - 1)
    air_s = air_resume_s(root, args.resume_seq_len, position)
    # iterate to skip: the same dataset read from 0, timed over a probe, extrapolated
    fresh = iter(ShardedDataset(root, seq_len=args.resume_seq_len, seed=1, dp_rank=0, dp_size=1))
    start = time.perf_counter()
    for _ in range(args.skip_probe):
        next(fresh)
    probe_s = time.perf_counter() - start
    return {
        "position": position,
        "air_s": air_s,
        "skip_s_extrapolated": probe_s * position / args.skip_probe,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GB of uint16 tokens to make")
    parser.add_argument("--dir", type=Path, help="reuse these shards (else a temp dir)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume-at", type=int, default=10**8)
    parser.add_argument("--resume-seq-len", type=int, default=8)
    parser.add_argument("--skip-probe", type=int, default=100_000)
    parser.add_argument(
        "--streaming-python",
        help="an interpreter where `import streaming` works (MosaicML Streaming needs its own"
        " venv here: docs/benchmarks.md); without it Streaming is not measured",
    )
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="air-data-bench-"))
    root = args.dir or tmp / "tokens"
    if args.dir is None:
        root.mkdir()
        start = time.perf_counter()
        make_shards(root, args.gb)
        print(
            f"made {args.gb} GB of tokens in {time.perf_counter() - start:.1f} s", file=sys.stderr
        )
    peers: dict[str, Any] = {
        "air": lambda: air_batches(root, args),
        "memmap DataLoader": lambda: memmap_batches(root, args),
    }
    streaming_note = "mosaicml-streaming not measured: pass --streaming-python"
    streaming_resumes: list[dict[str, float]] = []
    if args.streaming_python:
        mds = tmp / "mds"
        converted = streaming(args.streaming_python, "convert", root, mds, args.seq_len)
        streaming_note = f"mosaicml-streaming {converted['streaming_version']}: measured"
        print(f"wrote {converted['samples']:,} samples as MDS in {converted['seconds']:.0f} s")

        def streaming_rate() -> tuple[float, int]:
            out = streaming(
                args.streaming_python, "rate", mds, args.batch_size, args.workers, args.batches
            )
            return out["samples_per_s"], out["peak_pss"]

    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in peers}
    if args.streaming_python:
        runs["mosaicml-streaming"] = []
    # the same last position of the seq_len samples, resumed by both (Streaming's MDS
    # holds those samples only; 10^8 of them would take hours to write with MDSWriter)
    last = ShardedDataset(root, seq_len=args.seq_len, seed=1, dp_rank=0, dp_size=1).num_samples - 1
    for _ in range(args.rounds):
        for name, make in peers.items():
            runs[name].append(read_rate(make(), args.batches, args.batch_size))
        if args.streaming_python:
            runs["mosaicml-streaming"].append(streaming_rate())
            streaming_resumes.append(
                {
                    "air_s": air_resume_s(root, args.seq_len, last),
                    "streaming_s": streaming(args.streaming_python, "resume", mds, last)["seconds"],
                }
            )
    resumes = [resume_times(root, args) for _ in range(args.rounds)]

    air_rate = median([r for r, _ in runs["air"]])
    rows = []
    for name, results in runs.items():
        rate = median([r for r, _ in results])
        rss = median([m for _, m in results]) / 2**20
        rows.append([name, f"{rate:,.0f}", f"{rate / air_rate:.2f}x of AIR", f"{rss:,.0f} MiB"])
    print(
        header(
            f"data loading: {args.gb} GB uint16 tokens, seq {args.seq_len}, batch"
            f" {args.batch_size}, {args.workers} workers, medians of {args.rounds}"
        )
    )
    print(markdown_table(["loader", "samples/s", "ratio", "peak PSS (with workers)"], rows))
    air_resume = median([r["air_s"] for r in resumes])
    skip = median([r["skip_s_extrapolated"] for r in resumes])
    print(
        f"\nresume at position {resumes[0]['position']:,} (seq {args.resume_seq_len}):"
        f" AIR {air_resume * 1000:.1f} ms to the first sample; iterate-to-skip"
        f" {skip:,.0f} s (extrapolated from {args.skip_probe:,} samples)"
    )
    if streaming_resumes:
        air_last = median([r["air_s"] for r in streaming_resumes])
        streaming_last = median([r["streaming_s"] for r in streaming_resumes])
        print(
            f"resume at position {last:,} (seq {args.seq_len}): AIR {air_last * 1000:.1f} ms,"
            f" Streaming {streaming_last * 1000:.1f} ms to the first sample"
            f" ({streaming_last / air_last:.1f}x AIR's)"
        )
    print(f"\n{streaming_note}")
    write_result(
        "data",
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "runs": runs,
            "resumes": resumes,
            "streaming": streaming_note,
            "streaming_resumes": streaming_resumes,
        },
    )
    if args.dir is None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
