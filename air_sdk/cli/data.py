"""`air data index DIR`: write the shard index a `ShardedDataset` reads.

    air data index /data/fineweb-bin                # tokens: .bin (nanoGPT, llm.c) / .npy
    air data index /data/sft --format jsonl
    air data index /data/raw-uint32 --dtype uint32  # raw .bin files of uint32 tokens

It records every shard's size, sha256, sample (or token) count and sample offsets in
`DIR/index.json`; run it again whenever the shards change. The index code is
imported inside the command (numpy only when token shards are indexed; never torch).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from air_sdk.cli._common import JsonOption, console, echo_json, handle_errors
from air_sdk.text import plural

__all__ = ["data_app"]

data_app = typer.Typer(
    help="Datasets of shards: index a directory for air.data.ShardedDataset.",
    no_args_is_help=True,
)


class Format(str, Enum):
    """`--format` choices (`air_sdk.runtime.data._index.FORMATS`)."""

    tokens = "tokens"
    jsonl = "jsonl"
    tar = "tar"


class Dtype(str, Enum):
    """`--dtype` choices for raw `.bin` token files."""

    uint16 = "uint16"
    uint32 = "uint32"


@data_app.command("index")
@handle_errors
def index(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="The directory of shards (searched recursively).")
    ],
    format: Annotated[
        Format | None,
        typer.Option("--format", help="Shard format (default: from the file extensions)."),
    ] = None,
    dtype: Annotated[
        Dtype | None,
        typer.Option(
            "--dtype",
            help="Token type of raw .bin files (default uint16; llm.c headers and .npy say theirs).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Write DIR/index.json: every shard's size, sha256, samples and offsets."""
    from air_sdk.runtime.data._index import INDEX_NAME, write_index

    written = write_index(
        directory,
        format=format.value if format else None,
        dtype=dtype.value if dtype else None,
    )
    total = sum(shard.num_samples for shard in written.shards)
    size = sum(shard.bytes for shard in written.shards)
    if as_json:
        echo_json(
            {
                "index": str(directory / INDEX_NAME),
                "format": written.format,
                "dtype": written.dtype,
                "shards": len(written.shards),
                "tokens" if written.format == "tokens" else "samples": total,
                "bytes": size,
            }
        )
        return
    unit = f"{written.dtype} tokens" if written.format == "tokens" else "samples"
    console.print(
        f"wrote {directory / INDEX_NAME}: {plural(len(written.shards), 'shard')} of"
        f" {written.format}, {total:,} {unit}, {size:,} bytes",
        soft_wrap=True,
    )
