"""Read back a W&B offline run (`run-<id>.wandb`) in tests: the records W&B itself
wrote, as its protobuf `Record`s.

The file is W&B's transaction log: a 7-byte header (":W&B", a 2-byte magic, a version
byte), then LevelDB's log format: 32 KiB blocks of records, each `crc32c (4) | length
(2, little-endian) | type (1) | data`, where a record too big for a block's rest is
split into FIRST, MIDDLE... LAST pieces and a block's last < 7 bytes are padding.
wandb 0.31's Python package has no reader of its own (its Go core reads them)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, out, pending = HEADER, [], b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:
            pos += left_in_block  # padding at a block's end
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        elif kind == LAST:
            pending += chunk
        else:
            break  # zeros after the last record
        record = pb.Record()
        record.ParseFromString(pending)
        out.append(record)
        pending = b""
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """Every `run.log` row: {key: value}."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def summary(path: Path) -> dict[str, Any]:
    """The run's summary as its updates left it."""
    found: dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                found[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return found
