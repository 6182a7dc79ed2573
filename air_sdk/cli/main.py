"""The `air` command: submit and watch jobs, run a local gateway, try the demo.

    air gateway start --detach           # a gateway with 2 virtual nodes on this machine
    air submit train.py --nodes 2 --follow --epochs 3
    air submit -m mypkg.train --nodes 2  # python -m, as torchrun -m
    air jobs / air status [JOB] / air logs -f [JOB] / air metrics JOB / air cancel [JOB]
    air cancel --all                     # every job that has not ended (asks first)
    air checkpoints JOB / air checkpoints export JOB --to model.safetensors
    air outputs JOB / air outputs JOB --download [DEST]   # files under AIR_OUTPUT_DIR
    air demo                             # a 2-node DDP job end to end
    air admin token create --role viewer # tenants and tokens (admin token)
    air render k8s job.yaml --image IMG  # a Kubeflow TrainJob for Kubernetes
    air data index DIR                   # index shards for air.data.ShardedDataset

Every command talks to the gateway through `make_client` (tests replace it), and
prints an `AirError` as one `error: ...` line: exit code 2 when the command or
its inputs must change, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Unpack

import typer

from air_sdk.cli._common import (
    EXIT_INTERRUPTED,
    GatewayOption,
    JsonOption,
    console,
    echo_json,
    err_console,
    flag_message,
    handle_errors,
)
from air_sdk.cli.admin import admin_app
from air_sdk.cli.checkpoints import checkpoints_app
from air_sdk.cli.data import data_app
from air_sdk.cli.gateway import gateway_app
from air_sdk.cli.gc import gc as gc_command
from air_sdk.cli.job_flags import with_job_options
from air_sdk.cli.manifests import render_app
from air_sdk.cli.outputs import outputs as outputs_command
from air_sdk.cli.plan import plan_command
from air_sdk.cli.script_args import ScriptCommand
from air_sdk.cli.slo import slo as slo_command
from air_sdk.client.options import JobOptions
from air_sdk.errors import AirError, SpecError
from air_sdk.schema.api import JobStatus
from air_sdk.schema.state import JobState
from air_sdk.text import plural, span

if TYPE_CHECKING:
    from air_sdk.client import Client, Job
    from air_sdk.schema.api import JobRecord

__all__ = ["app", "main", "make_client"]

app = typer.Typer(
    name="air",
    help="AIR: multi-node PyTorch training from your laptop, notebook or cluster.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(gateway_app, name="gateway")
app.add_typer(admin_app, name="admin")
app.add_typer(render_app, name="render")
app.add_typer(checkpoints_app, name="checkpoints")
app.add_typer(data_app, name="data")
app.command("plan")(plan_command)
app.command("slo")(slo_command)

#: `air metrics` shows this many most recent rows unless --all
DEFAULT_METRIC_ROWS = 20

JobArgument = Annotated[str, typer.Argument(metavar="JOB", help="Job id (from `air jobs`).")]
OptionalJobArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="[JOB]",
        help="Job id (from `air jobs`); default: your newest job.",
        show_default=False,
    ),
]


def make_client(
    gateway: str | None = None, token: str | None = None, *, max_attempts: int = 6
) -> Client:
    """The client every command uses (the seam tests monkeypatch)."""
    from air_sdk.client import Client

    return Client(gateway_url=gateway, token=token, max_attempts=max_attempts)


def _version_callback(value: bool) -> None:
    if value:
        from air_sdk import __version__

        typer.echo(f"air {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Show version."),
    ] = False,
) -> None:
    """AIR: multi-node PyTorch training from your laptop, notebook or cluster."""


def _stdin_is_terminal() -> bool:
    """Whether a person can answer a question (tests replace it)."""
    return sys.stdin.isatty()


def _job_or_newest(client: Client, job_id: str | None, command: str) -> Job:
    """The job `job_id` names, or, without one, the newest job of this tenant (said on
    stderr, as `sky jobs logs` does)."""
    if job_id is not None:
        return client.job(job_id)
    from air_sdk.client import Job

    newest = client.newest_job()
    if newest is None:
        raise AirError(
            f"you have no jobs on {client.gateway_url} yet: submit one with `air submit`"
        )
    err_console.print(
        f"job {newest.id} ({newest.name}, {newest.state.value}): your newest;"
        f" `air {command} JOB` for another",
        style="dim",
        soft_wrap=True,
    )
    return Job(client, newest)


def _reattach_hint(job_id: str) -> None:
    err_console.print(
        f"\ndetached from job {job_id}; it keeps running.\n"
        f"  watch it again:  air logs -f {job_id}   (or: air status {job_id})\n"
        f"  stop it:         air cancel {job_id}",
        soft_wrap=True,
    )


@app.command(cls=ScriptCommand)
@handle_errors
@with_job_options
def submit(
    script: Annotated[
        Path | None,
        typer.Argument(
            metavar="SCRIPT",
            exists=True,
            dir_okay=False,
            readable=True,
            show_default=False,
            help="The training script (torchrun-style); or give -m MODULE instead.",
        ),
    ] = None,
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="ARGS",
            show_default=False,
            help="Arguments for the script: everything from the first option `air submit`"
            " does not know (or after `--`) on.",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Show live progress and rank 0's output until the job ends."
        ),
    ] = False,
    all_ranks: Annotated[
        bool, typer.Option("--all-ranks", help="With --follow: every rank's output, not rank 0's.")
    ] = False,
    gateway: GatewayOption = None,
    **options: Unpack[JobOptions],
) -> None:
    """Submit SCRIPT (or -m MODULE) as a multi-node job; prints the job id.

    Example: air submit train.py --nodes 2 --env LR=0.1 --follow --epochs 3

    As with torchrun, what follows the script is the script's: `air submit` keeps the flags it knows up to the first one it does not, and `--` passes the rest as is.

    The job options are those of `Client.submit_script` (air_sdk/client/options.py).
    """
    from air_sdk.cli.bundle_progress import BundleProgress

    client = make_client(gateway)
    from air_sdk.client.client import default_workdir

    what = str(options.get("workdir") or default_workdir(script))
    with BundleProgress(err_console, what) as progress:
        try:
            job = client.submit_script(
                script,
                args=list(args or ()),
                progress=progress,
                on_scan=progress.scanned,
                **options,
            )
        except SpecError as exc:  # said in the flags typed, not the spec's field names
            raise SpecError(flag_message(exc)) from exc.__cause__
    typer.echo(job.id)
    if not follow:
        err_console.print(f"follow it with: air logs -f {job.id}", style="dim", soft_wrap=True)
        return
    from air_sdk.cli.terminal_views import follow_to_end

    try:
        code = follow_to_end(job, console, log_ranks="all" if all_ranks else "rank0")
    except KeyboardInterrupt:
        _reattach_hint(job.id)
        code = EXIT_INTERRUPTED
    raise typer.Exit(code)


@app.command("jobs")
@handle_errors
def list_jobs(
    state: Annotated[
        JobState | None, typer.Option("--state", case_sensitive=False, help="Only this state.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 100,
    as_json: JsonOption = False,
    gateway: GatewayOption = None,
) -> None:
    """List your jobs, newest first."""
    from air_sdk.cli.terminal_views import jobs_table

    records = make_client(gateway).jobs(state=state, limit=limit)
    if as_json:
        echo_json([r.model_dump(mode="json") for r in records])
    elif not records:
        console.print("no jobs" + (f" in state {state.value}" if state else ""))
    else:
        console.print(jobs_table(records))


@app.command()
@handle_errors
def status(
    job_id: OptionalJobArgument = None, as_json: JsonOption = False, gateway: GatewayOption = None
) -> None:
    """State, attempts, progress and (for a failure) which rank failed and why.

    `--json` prints the job record plus `step`: the job's latest logged step (null
    before any `air.log`)."""
    from air_sdk.cli.terminal_views import status_text

    job = _job_or_newest(make_client(gateway), job_id, "status")
    record = job.record()
    snapshot = job.snapshot()
    if as_json:
        status = JobStatus(
            **record.model_dump(),
            step=snapshot.step,
            exports=snapshot.exports,
            data_loading=snapshot.data_summary,
        )
        echo_json(status.model_dump(mode="json"))
        return
    console.print(status_text(record, snapshot), soft_wrap=True)


@app.command()
@handle_errors
def logs(
    job_id: OptionalJobArgument = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing new lines until the job ends (exit 0: it succeeded).",
        ),
    ] = False,
    rank: Annotated[int | None, typer.Option(help="Only this rank.")] = None,
    attempt: Annotated[int | None, typer.Option(help="Only this attempt.")] = None,
    tail: Annotated[int | None, typer.Option(min=1, help="Only the last N lines.")] = None,
    gateway: GatewayOption = None,
) -> None:
    """Print a job's logs, each line prefixed with its rank; -f follows until the job ends."""
    from air_sdk.cli.terminal_views import exit_code_of
    from air_sdk.schema.events import EventType, LogBatch

    job = _job_or_newest(make_client(gateway), job_id, "logs")
    world_size = job.record().spec.resources.world_size
    if rank is not None and not 0 <= rank < world_size:
        raise typer.BadParameter(
            f"job {job.id} has {span('rank', world_size)}; there is no rank {rank}",
            param_hint="'--rank'",
        )
    last_seq = 0
    for page in job.log_pages(rank=rank, attempt=attempt, tail=tail):  # bounded pages
        for line in page.lines:
            typer.echo(f"[rank {line.rank}] {line.text}")
        last_seq = max(last_seq, page.last_seq)
    if not follow:
        return
    try:
        for event in job.follow(after=last_seq):
            if event.type is not EventType.LOG:
                continue
            if rank is not None and event.rank != rank:
                continue
            if attempt is not None and event.attempt != attempt:
                continue
            for text in event.payload_as(LogBatch).lines:
                typer.echo(f"[rank {event.rank if event.rank is not None else '?'}] {text}")
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    from air_sdk.cli.terminal_views import outcome_line

    final = job.record()
    err_console.print(
        f"job {job.id} ended: {final.state.value} ({outcome_line(final)})",
        style="dim",
        soft_wrap=True,
    )
    raise typer.Exit(exit_code_of(final.state))


@app.command()
@handle_errors
def metrics(
    job_id: JobArgument,
    name: Annotated[str | None, typer.Option(help="Only this metric.")] = None,
    rank: Annotated[int | None, typer.Option(help="Only this rank.")] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help=f"All rows, not the last {DEFAULT_METRIC_ROWS}.")
    ] = False,
    as_json: JsonOption = False,
    gateway: GatewayOption = None,
) -> None:
    """Logged metrics (`air.log`): one row per step and rank."""
    from air_sdk.cli.terminal_views import metrics_table
    from air_sdk.client import Job
    from air_sdk.schema.numbers import json_data

    job = Job(make_client(gateway), job_id)
    rows = job.metrics(name=name, rank=rank)
    if not rows and (name is not None or rank is not None):
        _explain_no_metrics(job, name, rank)  # a filter that matches nothing says why
    if not show_all:
        rows = rows[-DEFAULT_METRIC_ROWS:]
    if as_json:
        echo_json([json_data(r) for r in rows])  # NaN and infinities as strings
    elif not rows:
        console.print("no metrics yet")
    else:
        console.print(metrics_table(rows))


def _explain_no_metrics(job: Job, name: str | None, rank: int | None) -> None:
    """A `SpecError` (exit 2) when `--rank` is none of the job's ranks or `--name` was
    never logged; nothing when the job simply has not logged yet."""
    world = job.record().spec.resources.world_size
    if rank is not None and not 0 <= rank < world:
        raise SpecError(f"job {job.id} has ranks 0-{world - 1}: --rank {rank} is none of them")
    if name is not None:
        logged = sorted({key for row in job.metrics(rank=rank) for key in row.values})
        if logged:
            raise SpecError(
                f"job {job.id} logged no metric named {name!r}"
                + (f" on rank {rank}" if rank is not None else "")
                + f"; it logged: {', '.join(logged)}"
            )


@app.command()
@handle_errors
def cancel(
    job_id: OptionalJobArgument = None,
    all_jobs: Annotated[
        bool, typer.Option("--all", help="Every job of yours that has not ended (asks first).")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="With --all: do not ask.")] = False,
    gateway: GatewayOption = None,
) -> None:
    """Cancel a job (all its ranks, on every node); default: your newest job."""
    client = make_client(gateway)
    if all_jobs:
        if job_id is not None:
            raise typer.BadParameter("give JOB or --all, not both", param_hint="'--all'")
        _cancel_all(client, yes=yes)
        return
    _print_cancelled(_job_or_newest(client, job_id, "cancel").cancel())


#: jobs listed per request by `air cancel --all` (the gateway's largest page)
CANCEL_PAGE = 1000


def _print_cancelled(record: JobRecord) -> None:
    if record.state.terminal and record.state is not JobState.CANCELLED:
        console.print(f"job {record.id} had already ended: {record.state.value}")
    else:
        console.print(f"cancel requested for job {record.id} (now {record.state.value})")


def _cancel_all(client: Client, *, yes: bool) -> None:
    """`air cancel --all`: every job that has not ended, after a yes (or --yes). The
    gateway lists at most a page of jobs at once: pages are cancelled until a listing
    shows no job not yet cancelled."""
    from air_sdk.client import Job

    active = client.active_jobs(limit=CANCEL_PAGE)
    if not active:
        console.print("no queued or running jobs to cancel")
        return
    shown = ", ".join(r.id for r in active[:5]) + (
        f" and {len(active) - 5} more" if len(active) > 5 else ""
    )
    count = plural(len(active), "job") + (" or more" if len(active) >= CANCEL_PAGE else "")
    what = f"{count} that {'has' if len(active) == 1 else 'have'} not ended ({shown})"
    if not yes:
        if not _stdin_is_terminal():
            raise typer.BadParameter(
                f"this would cancel {what}; nobody can confirm here (not a terminal):"
                " add --yes to cancel them",
                param_hint="'--all'",
            )
        if not typer.confirm(f"cancel {what}?", default=False, err=True):
            err_console.print("nothing cancelled")
            raise typer.Exit(1)
    asked: set[str] = set()
    while active:
        for record in active:
            asked.add(record.id)
            _print_cancelled(Job(client, record).cancel())
        # Queued jobs leave the listing once cancelled; running ones stay until stopped.
        active = [r for r in client.active_jobs(limit=CANCEL_PAGE) if r.id not in asked]


app.command("gc")(gc_command)
app.command("outputs")(outputs_command)


@app.command()
@handle_errors
def demo(
    nodes: Annotated[int, typer.Option(min=1, help="Nodes (one rank each).")] = 2,
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 200,
    gateway: GatewayOption = None,
) -> None:
    """Run a small DDP job across virtual nodes and show it live (starts a gateway if needed)."""
    from air_sdk.cli.demo import run_demo

    raise typer.Exit(run_demo(make_client, gateway=gateway, nodes=nodes, steps=steps))


def main() -> None:
    """The `air` console script."""
    app(prog_name="air")


if __name__ == "__main__":
    main()
