"""`air checkpoints JOB` (list) and `air checkpoints export JOB|DIR --to FILE`.

    air checkpoints JOB                               # commits, skips, resumes
    air checkpoints export JOB --to model.safetensors # the newest checkpoint's model
    air checkpoints export JOB --step 300 --to model.safetensors --dtype bfloat16
    air checkpoints export /data/run/ckpt --to model.safetensors
    air checkpoints export JOB --to tuned/ --format hf  # a directory from_pretrained loads
    air checkpoints export JOB --to tuned --format hf --config /models/tiny-llama
    air checkpoints export JOB --to tuned --format hf --max-shard-size 2GB  # shards

`export` runs here, on the client: it reads the checkpoint's files, so they must be
reachable from this machine (see `air_sdk.checkpoints`). torch is imported only
inside `export`.
"""

from __future__ import annotations

import os
import time
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from air_sdk.cli._common import (
    GatewayOption,
    JsonOption,
    console,
    echo_json,
    handle_errors,
    print_table,
)
from air_sdk.text import age, clock

if TYPE_CHECKING:
    from typer._click.core import Context  # typer vendors click; its groups take this one

__all__ = ["checkpoints_app"]


class Dtype(str, Enum):
    """`--dtype` choices (`air_sdk.runtime.checkpoint.export.DTYPES`)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Format(str, Enum):
    """`--format` choices: one safetensors file, or a Hugging Face directory."""

    safetensors = "safetensors"
    hf = "hf"


class _ListByDefault(TyperGroup):
    """`air checkpoints JOB` is `air checkpoints list JOB`: a first word that is not a
    subcommand (a job id, an option) goes to `list`."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


checkpoints_app = typer.Typer(
    cls=_ListByDefault,
    help="A job's checkpoints: list them (the default), or export one as safetensors.",
    no_args_is_help=True,
)

JobArgument = Annotated[str, typer.Argument(metavar="JOB", help="Job id (from `air jobs`).")]


@checkpoints_app.command("list")
@handle_errors
def list_checkpoints(
    job_id: JobArgument, as_json: JsonOption = False, gateway: GatewayOption = None
) -> None:
    """Committed checkpoints of a job, the ones restore passed over, and resumes."""
    from rich.table import Table

    from air_sdk.cli.main import make_client
    from air_sdk.client import Job

    found = Job(make_client(gateway), job_id).checkpoints()
    if as_json:
        echo_json(found.model_dump(mode="json"))
        return
    if not found.commits:
        console.print("no committed checkpoints yet")
    else:
        table = Table("STEP", "SAVED", "ATTEMPT", "SIZE", "BLOCKED", "DURABLE AFTER", "PATH")
        now = time.time()
        for c in found.commits:
            saved = "" if c.committed_at is None else clock(c.committed_at, now)
            table.add_row(
                f"{c.step} (at the failure)" if c.at_failure else str(c.step),
                f"{saved} ({age(now - c.committed_at)})" if c.committed_at is not None else "",
                str(c.attempt),
                f"{c.size_bytes / 2**20:.1f} MiB",
                f"{c.blocked_s:.2f} s",
                f"{c.durable_s:.2f} s",
                f"{c.path} ({c.source})" if c.source else c.path,
            )
        print_table(table)
    for s in found.skipped:
        console.print(f"[yellow]skipped step {s.step}[/] (attempt {s.attempt}): {s.skipped}")
    for r in found.restores:
        console.print(f"attempt {r.attempt} resumed from step {r.step}")


@checkpoints_app.command("export")
@handle_errors
def export(
    source: Annotated[
        str,
        typer.Argument(
            metavar="JOB|DIR",
            help="A job id, or a checkpoint directory / URL (a root of step-N or one step-N).",
        ),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="FILE|DIR",
            help="The safetensors file to write, or the directory for --format hf.",
        ),
    ],
    step: Annotated[
        int | None,
        typer.Option("--step", min=0, help="Which checkpoint (default: the newest committed)."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="The state entry holding the model (default: the only one)."),
    ] = None,
    dtype: Annotated[
        Dtype | None,
        typer.Option("--dtype", help="Cast floating tensors (default: as saved)."),
    ] = None,
    fmt: Annotated[
        Format | None,
        typer.Option(
            "--format",
            help="safetensors (one file) or hf (model.safetensors + config.json in a"
            " directory, for from_pretrained). Default: hf when --to is a directory.",
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="DIR",
            help="With --format hf: the directory whose config.json to copy (default: the"
            " one air.load_pretrained kept beside the checkpoints).",
        ),
    ] = None,
    max_shard_size: Annotated[
        str | None,
        typer.Option(
            "--max-shard-size",
            metavar="SIZE",
            help="With --format hf: split the weights into files of at most SIZE (bytes,"
            " or 5GB, 500MB, 2GiB) with model.safetensors.index.json. Default: 5GB.",
        ),
    ] = None,
    as_json: JsonOption = False,
    gateway: GatewayOption = None,
) -> None:
    """Write a checkpoint's model as one safetensors file of full tensors (any layout),
    or as a Hugging Face directory (`--format hf`)."""
    from air_sdk.checkpoints import export as export_checkpoint
    from air_sdk.checkpoints import is_location

    client: Any = None
    if not is_location(source):
        from air_sdk.cli.main import make_client

        client = make_client(gateway)
    cast = dtype.value if dtype is not None else None
    as_hf = fmt is Format.hf or (fmt is None and (os.path.isdir(to) or to.endswith("/")))
    if as_hf:
        from air_sdk.checkpoints import export_hf

        done = export_hf(
            source,
            step,
            to,
            key=key,
            dtype=cast,
            config=config,
            max_shard_size=max_shard_size or "5GB",
            client=client,
        )
    elif config is not None:
        raise typer.BadParameter("--config goes with --format hf", param_hint="--config")
    elif max_shard_size is not None:
        raise typer.BadParameter(
            "--max-shard-size goes with --format hf (one --to FILE is one file)",
            param_hint="--max-shard-size",
        )
    else:
        done = export_checkpoint(source, step, to, key=key, dtype=cast, client=client)
    if as_json:
        echo_json(
            {
                "path": done.path,
                "step": done.step,
                "key": done.key,
                "num_tensors": done.num_tensors,
                "num_bytes": done.num_bytes,
                "source": done.source,
                "skipped": list(done.skipped),
                "shards": list(done.shards),
            }
        )
        return
    console.print(
        f"wrote {done.path}: step {done.step}, {done.num_tensors} tensors"
        f" ({done.num_bytes / 2**20:.1f} MiB) of state[{done.key!r}] from {done.source}"
    )
    if done.shards:
        console.print(f"in {len(done.shards)} shards and model.safetensors.index.json")
    if done.skipped:
        console.print(f"[yellow]not tensors, left out:[/] {', '.join(done.skipped)}")
