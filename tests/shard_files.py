"""Shard directories for the `air.data.ShardedDataset` tests: every sample carries its own
id, so a test can say which samples a run consumed."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np

#: token shards: shard s holds tokens s * 10000 + arange(...), so a sample's first token
#: says where it came from; SIZES are samples per shard at SEQ_LEN
SEQ_LEN = 8
SIZES = (17, 20, 23)


def token_shards(root: Path, sizes: tuple[int, ...] = SIZES, seq_len: int = SEQ_LEN) -> Path:
    """Raw uint16 `.bin` shards (nanoGPT's format) of `sizes[s]` samples of `seq_len`."""
    root.mkdir(parents=True, exist_ok=True)
    for s, count in enumerate(sizes):
        tokens = s * 10000 + np.arange(count * seq_len + 1, dtype=np.uint16)
        tokens.tofile(root / f"shard-{s:03d}.bin")
    return root


def token_ids(sample: object) -> int:
    """The id of a token sample: its first token."""
    return int(sample[0])  # type: ignore[index]


def jsonl_shards(root: Path, sizes: tuple[int, ...] = (5, 7)) -> list[dict[str, object]]:
    """JSONL shards whose samples are {"id": i, "text": ...} (with a blank line to skip)."""
    root.mkdir(parents=True, exist_ok=True)
    written: list[dict[str, object]] = []
    for s, count in enumerate(sizes):
        lines = []
        for k in range(count):
            sample = {"id": len(written), "text": "x" * k + "\u00e9"}
            written.append(sample)
            lines.append(json.dumps(sample))
        (root / f"part-{s}.jsonl").write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]))
    return written


def tar_shards(root: Path, sizes: tuple[int, ...] = (4, 3)) -> list[dict[str, object]]:
    """WebDataset tars: each sample `KEY.txt` + `KEY.cls` (and a `KEY.seg.png` on some)."""
    root.mkdir(parents=True, exist_ok=True)
    written: list[dict[str, object]] = []
    for s, count in enumerate(sizes):
        with tarfile.open(root / f"shard-{s}.tar", "w") as tar:
            for k in range(count):
                key = f"sub/{s:02d}{k:04d}"
                members: dict[str, bytes] = {
                    "txt": f"sample {s}/{k}".encode(),
                    "cls": str(k).encode(),
                }
                if k % 2:
                    members["seg.png"] = bytes(range(k + 3))
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                written.append({"__key__": key, **members})
    return written
