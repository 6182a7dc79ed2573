"""`air outputs JOB` (list the job's output directory) and `air outputs JOB --download
[DEST]` (fetch it, default `./<job id>`).

    air outputs train-5d41402a
    air outputs train-5d41402a --download runs/7

The files are what the job's ranks wrote under `AIR_OUTPUT_DIR` (`air.output_dir()`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from air_sdk.cli._common import (
    GatewayOption,
    JsonOption,
    console,
    echo_json,
    handle_errors,
    print_table,
)
from air_sdk.cli.gc import human_bytes
from air_sdk.text import plural

__all__ = ["outputs"]


@handle_errors
def outputs(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id (from `air jobs`).")],
    dest: Annotated[
        Path | None,
        typer.Argument(
            metavar="[DEST]",
            help="With --download: the directory to fetch into (default: ./JOB).",
            show_default=False,
        ),
    ] = None,
    download: Annotated[
        bool, typer.Option("--download", help="Fetch every file into DEST.")
    ] = False,
    as_json: JsonOption = False,
    gateway: GatewayOption = None,
) -> None:
    """List the files a job kept in its output directory (AIR_OUTPUT_DIR), or download them.

    Ranks start in the job's code copy, so relative paths land there and `air gc`
    deletes them; what a job writes under `air.output_dir()` stays and is listed here.
    """
    from rich.table import Table

    from air_sdk.cli.main import make_client
    from air_sdk.client import Job

    if dest is not None and not download:
        raise typer.BadParameter(
            f"{dest} is where --download puts the files: add --download", param_hint="DEST"
        )
    job = Job(make_client(gateway), job_id)
    if download:
        target = dest if dest is not None else Path(job_id)
        written = job.download_outputs(target)
        if as_json:
            echo_json({"directory": str(target), "files": [str(p) for p in written]})
            return
        size = sum(p.stat().st_size for p in written)
        console.print(
            f"downloaded {plural(len(written), 'file')} ({human_bytes(size)}) to {target}"
        )
        return
    listing = job.outputs()
    if as_json:
        echo_json(listing.model_dump(mode="json"))
        return
    if not listing.files:
        console.print(
            f"no outputs yet in {listing.directory}: a job keeps files by writing under"
            " air.output_dir() ($AIR_OUTPUT_DIR)"
        )
        return
    table = Table("PATH", "SIZE", "MODIFIED")
    for f in listing.files:
        table.add_row(
            f.path,
            human_bytes(f.bytes),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.mtime)),
        )
    print_table(table)
    console.print(
        f"{plural(len(listing.files), 'file')}, {human_bytes(listing.total_bytes)} in"
        f" {listing.directory}; fetch them with `air outputs {job_id} --download [DEST]`",
        soft_wrap=True,  # a path to copy stays whole
    )
