"""MosaicML Streaming's side of `benchmarks/data.py`, run in the interpreter given by
`--streaming-python` (Streaming's requirements do not install beside AIR's torch 2.13
CPU; docs/benchmarks.md says how that venv is made). Prints one JSON line.

    python _streaming_peer.py convert TOKENS_DIR MDS_DIR SEQ_LEN
    python _streaming_peer.py rate MDS_DIR BATCH_SIZE WORKERS BATCHES
    python _streaming_peer.py resume MDS_DIR POSITION
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _loading import read_rate

SEED = 1


def convert(root: Path, mds: Path, seq_len: int) -> dict[str, Any]:
    """The same samples as AIR's (seq_len + 1 tokens from k * seq_len of each shard), as
    MDS shards of about the same size."""
    from streaming import MDSWriter

    start = time.perf_counter()
    num = 0
    with MDSWriter(out=str(mds), columns={"tokens": "ndarray:uint16"}, size_limit="200mb") as out:
        for f in sorted(root.glob("*.bin")):
            tokens = np.memmap(f, dtype=np.uint16, mode="r")
            for k in range((len(tokens) - 1) // seq_len):
                out.write({"tokens": np.array(tokens[k * seq_len : (k + 1) * seq_len + 1])})
                num += 1
    return {"samples": num, "seconds": time.perf_counter() - start}


def dataset(mds: Path, batch_size: int) -> Any:
    import torch
    from streaming import StreamingDataset

    class Tokens(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, i: int) -> Any:  # the same int64 tensor AIR's decoder gives
            return torch.from_numpy(super().__getitem__(i)["tokens"].astype(np.int64))

    return Tokens(
        local=str(mds),
        shuffle=True,
        shuffle_seed=SEED,
        shuffle_algo="py1br",  # nearest to AIR's py1b (Streaming 0.13 no longer has py1b)
        batch_size=batch_size,
        num_canonical_nodes=1,
    )


def rate(mds: Path, batch_size: int, workers: int, batches: int) -> dict[str, Any]:
    from streaming import StreamingDataLoader

    data = dataset(mds, batch_size)
    stream = StreamingDataLoader(data, batch_size=batch_size, num_workers=workers)
    samples_per_s, peak = read_rate(stream, batches, batch_size)
    return {"samples_per_s": samples_per_s, "peak_pss": peak}


def resume(mds: Path, position: int) -> dict[str, Any]:
    """Time from a fresh dataset loading `sample_in_epoch=position` to its first sample
    (Streaming's own resume: the state its StreamingDataLoader saves). Imports come
    first, untimed, as AIR's are already done in its measurement."""
    import streaming  # noqa: F401
    import torch  # noqa: F401

    start = time.perf_counter()
    data = dataset(mds, 1)
    data.load_state_dict(
        {
            "epoch": 0,
            "sample_in_epoch": position,
            "num_canonical_nodes": 1,
            "shuffle_seed": SEED,
            "initial_physical_nodes": 1,
        }
    )
    next(iter(data))
    return {"position": position, "seconds": time.perf_counter() - start}


def main() -> None:
    command, mds = sys.argv[1], None
    if command == "convert":
        out = convert(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    elif command == "rate":
        mds = Path(sys.argv[2])
        out = rate(mds, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif command == "resume":
        out = resume(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown command {command!r}: convert, rate or resume")
    import streaming

    out["streaming_version"] = streaming.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TMPDIR", tempfile.gettempdir())
    main()
