"""The shard index: `index.json` next to the shards, written once by `air data index DIR`.

It records, per shard, the byte size and sha256 (so a store can verify a download and
a reader can tell a stale index) and how many samples (or tokens) it holds. Where each
sample starts (JSONL lines, tar members) goes into one table per shard beside it,
`.air-index/<shard>.offsets` (little-endian uint64) or `.air-index/<shard>.samples.json`,
with its own size and sha256 in the index: `index.json` stays a few hundred bytes per
shard whatever the shards hold, and a reader loads a shard's table when it opens the
shard, so that sample i is read with one seek: nothing is scanned at training time.

Formats, told apart by the files' extensions unless `format=` says:

* `tokens`: `.bin` / `.npy` arrays of uint16 or uint32 token ids (nanoGPT, llm.c).
  A `.bin` that opens with llm.c's 1024-byte header (int32 magic 20240520 for uint16
  tokens or 20240801 for uint32, then a version, then the token count) is read past
  the header, its count checked against the file size; any other `.bin` is raw tokens
  of `dtype` (default uint16). A `.npy` carries its own dtype and header.
* `jsonl`: one JSON sample per line (blank lines are skipped).
* `tar`: WebDataset-style: members grouped into samples by key (the path up to the
  first dot of the file name), each sample a dict of extension -> bytes.

Torch-free (the `air` CLI writes indexes).

Example:
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / "a.jsonl").write_text('{"x": 1}\\n{"x": 2}\\n')
    >>> index = write_index(root)
    >>> index.format, [(s.name, s.num_samples) for s in index.shards]
    ('jsonl', [('a.jsonl', 2)])
    >>> entry = read_index(root).shards[0]
    >>> entry.table, load_table(entry, root / entry.table).tolist()
    ('.air-index/a.jsonl.offsets', [0, 9, 18])
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from air_sdk.errors import ConfigError

__all__ = [
    "EXTENSIONS",
    "FORMATS",
    "INDEX_NAME",
    "INDEX_VERSION",
    "DataIndex",
    "ShardEntry",
    "TABLE_DIR",
    "TarSample",
    "load_table",
    "read_index",
    "write_index",
]

INDEX_NAME = "index.json"
INDEX_VERSION = 2
#: where the per-shard sample tables go, under the index's directory
TABLE_DIR = ".air-index"
Format = Literal["tokens", "jsonl", "tar"]
FORMATS: tuple[str, ...] = ("tokens", "jsonl", "tar")
#: which file extensions are shards of which format
EXTENSIONS: dict[str, str] = {".bin": "tokens", ".npy": "tokens", ".jsonl": "jsonl", ".tar": "tar"}
TokenDtype = Literal["uint16", "uint32"]
#: llm.c's `.bin` header: 256 int32, [magic, version, number of tokens, ...]
LLMC_HEADER_BYTES = 1024
LLMC_MAGIC: dict[int, str] = {20240520: "uint16", 20240801: "uint32"}


class TarSample(BaseModel):
    """One sample of a tar shard: its key and, per extension, (data offset, size)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key: str
    members: dict[str, tuple[int, int]]


class ShardEntry(BaseModel):
    """One shard file as the index records it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    """The file's path relative to the index's directory."""
    bytes: int
    sha256: str
    num_samples: int
    """Samples (JSONL lines, tar samples); for `tokens`, the number of tokens."""
    header_bytes: int = 0
    """tokens: bytes before the first token (llm.c header, `.npy` header)."""
    table: str | None = None
    """jsonl, tar: the sample table's path relative to the index's directory: every
    line's byte offset, then the file's size (jsonl), or every sample's members (tar)."""
    table_bytes: int | None = None
    table_sha256: str | None = None


class DataIndex(BaseModel):
    """`index.json`: the format, the token dtype and every shard, in name order."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: Literal[2] = 2
    format: Format
    dtype: TokenDtype | None = None
    shards: list[ShardEntry]


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _shard_files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.suffix in EXTENSIONS and p.is_file() and not p.name.startswith(".")
    )


def _detect_format(files: list[Path], root: Path) -> str:
    found = sorted({EXTENSIONS[p.suffix] for p in files})
    if not found:
        raise ConfigError(
            f"no shards in {root}: expected files ending in {', '.join(sorted(EXTENSIONS))}"
        )
    if len(found) > 1:
        raise ConfigError(
            f"{root} holds shards of several formats ({', '.join(found)}): put each format in"
            " its own directory, or pass --format to index one of them"
        )
    return found[0]


def _token_entry(path: Path, name: str, dtype: str | None) -> tuple[ShardEntry, str]:
    import numpy as np

    size = path.stat().st_size
    if path.suffix == ".npy":
        array = np.load(path, mmap_mode="r")
        if array.ndim != 1 or array.dtype.name not in ("uint16", "uint32"):
            raise ConfigError(
                f"{name} holds a {array.dtype.name} array of shape {array.shape}: token shards"
                " are 1-D uint16 or uint32 arrays"
            )
        header, found, count = int(array.offset), array.dtype.name, int(array.shape[0])
    else:
        header, found, count = 0, dtype or "uint16", -1
        if size >= LLMC_HEADER_BYTES:
            head = np.fromfile(path, dtype="<i4", count=3)
            llmc = LLMC_MAGIC.get(int(head[0]))
            itemsize = np.dtype(llmc).itemsize if llmc else 0
            if llmc and LLMC_HEADER_BYTES + int(head[2]) * itemsize == size:
                header, found, count = LLMC_HEADER_BYTES, llmc, int(head[2])
        if count < 0:
            itemsize = np.dtype(found).itemsize
            if size % itemsize:
                raise ConfigError(
                    f"{name} is {size} bytes, not a whole number of {found} tokens: pass the"
                    " right --dtype"
                )
            count = size // itemsize
    if dtype is not None and dtype != found:
        raise ConfigError(f"{name} holds {found} tokens, not {dtype}: drop --dtype or fix it")
    entry = ShardEntry(
        name=name, bytes=size, sha256=_sha256(path), num_samples=count, header_bytes=header
    )
    return entry, found


def _jsonl_entry(path: Path, name: str) -> tuple[ShardEntry, bytes]:
    offsets: list[int] = []
    position = 0
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            if line.strip():
                try:
                    json.loads(line)
                except ValueError as exc:
                    raise ConfigError(f"{name} line {number} is not JSON: {exc}") from None
                offsets.append(position)
            position += len(line)
    offsets.append(position)
    import numpy as np

    table = np.asarray(offsets, dtype="<u8").tobytes()
    entry = ShardEntry(
        name=name, bytes=position, sha256=_sha256(path), num_samples=len(offsets) - 1,
        **_table_fields(f"{name}.offsets", table),
    )  # fmt: skip
    return entry, table


def _table_fields(name: str, data: bytes) -> dict[str, Any]:
    """The entry's fields for its table `data` (`_write_tables` writes it there)."""
    return {
        "table": f"{TABLE_DIR}/{name}",
        "table_bytes": len(data),
        "table_sha256": hashlib.sha256(data).hexdigest(),
    }


_SAMPLES = TypeAdapter(list[TarSample])


def load_table(entry: ShardEntry, path: Path) -> Any:
    """The sample table of `entry` at `path`: the offsets of a jsonl shard (uint64 array
    of num_samples + 1), the samples of a tar shard; a table that does not fit the entry
    is refused (the index is stale)."""
    import numpy as np

    stale = f"the sample table of {entry.name} does not match its index: run `air data index` again"
    if entry.table is not None and entry.table.endswith(".offsets"):
        offsets = np.fromfile(path, dtype="<u8")
        if len(offsets) != entry.num_samples + 1 or int(offsets[-1]) != entry.bytes:
            raise ConfigError(stale)
        return offsets
    try:
        samples = _SAMPLES.validate_json(path.read_bytes())
    except ValidationError:
        raise ConfigError(stale) from None
    if len(samples) != entry.num_samples:
        raise ConfigError(stale)
    return samples


def split_member_name(member: str) -> tuple[str, str]:
    """WebDataset's (key, extension): the path up to the first dot of the file name.

    Example:
        >>> split_member_name("train/000123.seg.png")
        ('train/000123', 'seg.png')
    """
    directory, _, base = member.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return "", ""
    return (f"{directory}/{stem}" if directory else stem), ext


def _tar_entry(path: Path, name: str) -> tuple[ShardEntry, bytes]:
    samples: list[TarSample] = []
    key: str | None = None
    members: dict[str, tuple[int, int]] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                member_key, ext = split_member_name(member.name)
                if not member_key:
                    raise ConfigError(
                        f"{name}: member {member.name!r} has no key.extension name; a"
                        " WebDataset shard names each file KEY.EXT"
                    )
                if member_key != key and key is not None:
                    samples.append(TarSample(key=key, members=members))
                    members = {}
                if ext in members:
                    raise ConfigError(f"{name}: sample {member_key!r} has two {ext!r} members")
                key = member_key
                members[ext] = (member.offset_data, member.size)
    except tarfile.TarError as exc:
        raise ConfigError(f"{name} is not an uncompressed tar file: {exc}") from None
    if key is not None:
        samples.append(TarSample(key=key, members=members))
    table = _SAMPLES.dump_json(samples)
    entry = ShardEntry(
        name=name, bytes=path.stat().st_size, sha256=_sha256(path), num_samples=len(samples),
        **_table_fields(f"{name}.samples.json", table),
    )  # fmt: skip
    return entry, table


def write_index(
    directory: str | os.PathLike[str], *, format: str | None = None, dtype: str | None = None
) -> DataIndex:
    """Scan the shards under `directory`, write `index.json` there and return it.

    `format`: tokens, jsonl or tar (default: from the extensions); `dtype`: the token
    type of raw `.bin` files (default uint16; llm.c headers and `.npy` carry theirs).
    """
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory of shards")
    if format is not None and format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}: use one of {', '.join(FORMATS)}")
    if dtype is not None and dtype not in ("uint16", "uint32"):
        raise ConfigError(f"unknown token dtype {dtype!r}: use uint16 or uint32")
    files = _shard_files(root)
    fmt = format or _detect_format(files, root)
    files = [p for p in files if EXTENSIONS[p.suffix] == fmt]
    if not files:
        raise ConfigError(f"no {fmt} shards in {root}")
    shards: list[ShardEntry] = []
    dtypes: set[str] = set()
    tables: dict[str, bytes] = {}
    for path in files:
        name = path.relative_to(root).as_posix()
        if fmt == "tokens":
            entry, found = _token_entry(path, name, dtype)
            dtypes.add(found)
        else:
            entry, table = (_jsonl_entry if fmt == "jsonl" else _tar_entry)(path, name)
            assert entry.table is not None
            tables[entry.table] = table
        shards.append(entry)
    if len(dtypes) > 1:
        raise ConfigError(f"{root} mixes token dtypes ({', '.join(sorted(dtypes))}): convert them")
    index = DataIndex(format=fmt, dtype=dtypes.pop() if dtypes else None, shards=shards)
    _write_tables(root, tables)
    temporary = root / f".{INDEX_NAME}.tmp"
    temporary.write_text(index.model_dump_json(exclude_none=True) + "\n")
    temporary.replace(root / INDEX_NAME)
    return index


def _write_tables(root: Path, tables: dict[str, bytes]) -> None:
    # Before the index that names them; tables no shard has any more are removed.
    for name, data in tables.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(data)
        temporary.replace(path)
    if (root / TABLE_DIR).is_dir():
        for path in sorted((root / TABLE_DIR).rglob("*"), reverse=True):
            if path.is_file() and path.relative_to(root).as_posix() not in tables:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()


def parse_index(raw: str | bytes, where: str, run: str) -> DataIndex:
    """The index in `raw` (the text of `where`), validated; `run` says how to write it
    again."""
    try:
        index = DataIndex.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ConfigError(
            f"{where} is not a valid index (version {INDEX_VERSION}): {field}: {first['msg']};"
            f" {run} again"
        ) from None
    if not index.shards:
        raise ConfigError(f"{where} lists no shards; {run} again")
    return index


def read_index(directory: str | os.PathLike[str], *, check_files: bool = True) -> DataIndex:
    """`index.json` of `directory`, validated; with `check_files`, also that every shard
    is there with its recorded size and no shard file is missing from it."""
    root = Path(directory)
    path = root / INDEX_NAME
    run = f"run `air data index {root}`"
    try:
        raw = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{root} has no {INDEX_NAME}: {run} once to write it") from None
    index = parse_index(raw, str(path), run)
    if check_files:
        listed = {shard.name for shard in index.shards}
        for shard in index.shards:
            try:
                size = (root / shard.name).stat().st_size
            except FileNotFoundError:
                raise ConfigError(f"{path} is stale: {shard.name} is gone; {run} again") from None
            if size != shard.bytes:
                raise ConfigError(
                    f"{path} is stale: {shard.name} is {size} bytes, the index says"
                    f" {shard.bytes}; {run} again"
                )
            if shard.table is not None and not (root / shard.table).is_file():
                raise ConfigError(f"{path} is stale: {shard.table} is gone; {run} again")
        extra = [
            p.relative_to(root).as_posix()
            for p in _shard_files(root)
            if EXTENSIONS[p.suffix] == index.format and p.relative_to(root).as_posix() not in listed
        ]
        if extra:
            raise ConfigError(
                f"{path} is stale: {extra[0]} is not in it"
                + (f" (and {len(extra) - 1} more)" if extra[1:] else "")
                + f"; {run} again"
            )
    return index
