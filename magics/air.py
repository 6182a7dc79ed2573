"""`%%air train` and the `%air` line magics: parse, one SDK call, show.

    %air gateway start              # an embedded gateway for this notebook (reused if up)
    %%air train --nodes 2 --env LR=0.1
    ...training code, run on every rank...
    %air jobs / %air status JOB / %air logs JOB --rank 1 --tail 20 / %air cancel JOB
    %air attach JOB                 # the monitor again, e.g. after a kernel restart

`%%air train` packages the cell (`air_sdk.notebook.capture`), submits it and
returns at once with the live monitor displayed, so the kernel stays free and
the monitor's Cancel button works; `--wait` blocks until the job ends. The job
is stored as `_air_job` in the notebook. Every call to the gateway goes through
`make_client` (tests replace it); the monitor is shown by `show_monitor`.
"""

from __future__ import annotations

import argparse
import html
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments
from IPython.display import display
from IPython.utils.process import arg_split

from air_sdk.errors import AirError, JobFailedError, SpecError, TransportError
from air_sdk.schema.state import JobState

if TYPE_CHECKING:
    from air_sdk.client import Client, Job
    from air_sdk.schema.api import JobRecord

__all__ = ["AirMagics", "make_client", "show_monitor"]

COMMANDS = ("train", "gateway", "jobs", "status", "logs", "cancel", "attach")
GATEWAY_ACTIONS = ("start", "stop", "status")
#: the job name when --name is not given
DEFAULT_JOB_NAME = "cell"
#: the name `%%air train` and `%air attach` bind the job to in the notebook
JOB_VARIABLE = "_air_job"
DEFAULT_VIRTUAL_NODES = 2

# option dest -> the commands it applies to
_OPTION_COMMANDS: dict[str, tuple[str, ...]] = {
    "procs_per_node": ("train",),
    "gpus_per_node": ("train",),
    "name": ("train",),
    "max_restarts": ("train",),
    "checkpoint_every": ("train",),
    "pool": ("train",),
    "priority": ("train",),
    "accelerator": ("train",),
    "env": ("train",),
    "files": ("train",),
    "workdir": ("train",),
    "max_value_mib": ("train",),
    "wait": ("train",),
    "total_steps": ("train", "attach"),
    "nodes": ("train", "gateway"),
    "slots_per_node": ("gateway",),
    "port": ("gateway",),
    "home": ("gateway",),
    "rank": ("logs",),
    "tail": ("logs",),
    "limit": ("jobs",),
}
# how many positional arguments each command takes
_NUM_ARGS = {
    "train": 0,
    "gateway": 1,
    "jobs": 0,
    "status": 1,
    "logs": 1,
    "cancel": 1,
    "attach": 1,
}
_ARG_HINT = {
    "gateway": "start, stop or status (e.g. %air gateway start)",
    "status": "a job id (e.g. %air status j-3f2a; %air jobs lists them)",
    "logs": "a job id (e.g. %air logs j-3f2a --tail 20)",
    "cancel": "a job id (e.g. %air cancel j-3f2a)",
    "attach": "a job id (e.g. %air attach j-3f2a)",
}


def make_client(
    gateway: str | None = None, token: str | None = None, *, max_attempts: int = 6
) -> Client:
    """The client every magic uses (the seam tests monkeypatch)."""
    from air_sdk.client import Client

    return Client(gateway_url=gateway, token=token, max_attempts=max_attempts)


def show_monitor(job: Job, **options: Any) -> None:
    """Display the live monitor of `job` (the seam tests replace)."""
    try:
        monitor = job.monitor(**options)
    except ImportError as exc:  # no ipywidgets here: the job runs all the same
        print(
            f"job {job.id} submitted; no live monitor ({exc}). Watch it with %air status {job.id}"
        )
        return
    display(monitor)


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, not {value}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE (for example --env LR=0.1; IPython expands $var there)"
        )
    return key.strip(), value


@magics_class
class AirMagics(Magics):
    """The `%air` / `%%air` magics; registered by `%load_ext air_sdk` (or `magics`).

    Example:
        >>> ip = get_ipython()  # doctest: +SKIP
        >>> ip.register_magics(AirMagics)  # doctest: +SKIP
    """

    @magic_arguments()
    @argument("command", choices=COMMANDS, help="What to do (see above).")
    @argument(
        "args",
        nargs="*",
        metavar="ARG",
        help="JOB for status/logs/cancel/attach; start|stop|status for gateway.",
    )
    @argument(
        "--gateway",
        metavar="URL",
        help="Gateway URL (default: $AIR_GATEWAY_URL or ~/.config/air/config.toml; the token comes from $AIR_TOKEN or that file).",
    )
    @argument_group("%%air train")
    @argument(
        "--nodes",
        "-n",
        type=_count(1),
        metavar="N",
        help="Nodes, gang-scheduled (default 1). With `gateway start`: virtual nodes to split this machine into (default 2).",
    )
    @argument("--procs-per-node", type=_count(1), metavar="N", help="Ranks per node (default 1).")
    @argument(
        "--gpus-per-node",
        type=_count(0),
        metavar="N",
        help="GPUs per node, one rank each (default 0: CPU).",
    )
    @argument(
        "--name",
        metavar="NAME",
        help=f"Job name, 1-63 of [A-Za-z0-9._-] (default {DEFAULT_JOB_NAME!r}).",
    )
    @argument(
        "--max-restarts",
        type=_count(0),
        metavar="N",
        help="Relaunches after a failure, from the last checkpoint (default 0).",
    )
    @argument(
        "--checkpoint-every",
        type=_count(1),
        metavar="STEPS",
        help="Checkpoint interval handed to the runtime (spec.checkpoint.every_steps).",
    )
    @argument(
        "--pool",
        metavar="POOL",
        help="Node pool to run in (default 'default'; 'any': the scheduler chooses).",
    )
    @argument(
        "--priority",
        choices=("low", "normal", "high"),
        help="Priority class (default normal); high may preempt lower-priority jobs.",
    )
    @argument(
        "--accelerator", metavar="TYPE", help="Accelerator type: a100, h100, cpu; gpu for any GPU."
    )
    @argument(
        "--env",
        "-e",
        type=_env_pair,
        action="append",
        metavar="KEY=VALUE",
        help="Env var for every rank; repeat for more. Nothing else from the notebook's environment travels.",
    )
    @argument(
        "--files",
        nargs="+",
        action="extend",
        metavar="PATH",
        help="Extra files or directories to send (relative to the working directory; those outside it land at the top of the bundle).",
    )
    @argument(
        "--workdir",
        metavar="DIR",
        help="Directory to send with the cell (default: the working directory; .gitignore/.airignore respected).",
    )
    @argument(
        "--max-value-mib",
        type=_count(1),
        metavar="MIB",
        help="Largest notebook value that may travel with the cell, pickled (default 64).",
    )
    @argument(
        "--total-steps",
        type=_count(1),
        metavar="N",
        help="Steps of the run, for the monitor's progress bar and ETA (also for attach).",
    )
    @argument(
        "--wait",
        action="store_true",
        help="Block until the job ends, then show its final state (by default the magic returns at once).",
    )
    @argument_group("%air logs")
    @argument("--rank", type=_count(0), metavar="R", help="Only this rank's lines.")
    @argument("--tail", type=_count(1), metavar="N", help="Only the last N lines.")
    @argument_group("%air jobs")
    @argument(
        "--limit", type=_count(1), metavar="N", help="At most N jobs, newest first (default 20)."
    )
    @argument_group("%air gateway start|stop|status")
    @argument(
        "--port",
        type=_count(1),
        metavar="PORT",
        help="Port of the embedded gateway (default 8470).",
    )
    @argument(
        "--home",
        metavar="DIR",
        help="Where it keeps its state (default $AIR_HOME or ~/.local/share/air).",
    )
    @argument(
        "--slots-per-node",
        type=_count(1),
        metavar="N",
        help="Rank slots per virtual node (default: cores or GPUs divided evenly).",
    )
    @line_cell_magic
    def air(self, line: str, cell: str | None = None) -> None:
        """
        Train a cell on an AIR cluster, and watch or manage jobs.

        %%air train [options]   run the cell below on every rank; returns at once
                                with the live monitor (the job is `_air_job`)
        %air gateway start|stop|status   an embedded gateway on this machine
        %air jobs               your jobs, newest first
        %air status JOB         state, attempts and failure of one job
        %air logs JOB           its output, `[rank N] line`
        %air cancel JOB         cancel it on every node
        %air attach JOB         show its monitor again (e.g. after a kernel restart)

        What the cell uses from earlier cells travels with it: modules are imported
        again, functions, classes and values are pickled (cloudpickle). A value that
        cannot travel, or is over --max-value-mib, is refused before upload.
        """
        args = _parse(line)
        _check_applicable(args, cell)
        try:
            if args.command == "train":
                assert cell is not None
                self._train(args, cell)
            elif args.command == "gateway":
                self._gateway(args)
            elif args.command == "jobs":
                _show_jobs(make_client(args.gateway).jobs(limit=args.limit or 20))
            elif args.command == "status":
                print(_status_text(make_client(args.gateway).job_record(args.args[0])))
            elif args.command == "logs":
                self._logs(args)
            elif args.command == "cancel":
                self._cancel(args)
            elif args.command == "attach":
                job = make_client(args.gateway).job(args.args[0])
                self._user_ns[JOB_VARIABLE] = job
                show_monitor(job, **_monitor_options(args))
        except AirError as exc:
            _render_as_one_line(exc)
            raise

    @property
    def _user_ns(self) -> dict[str, Any]:
        assert self.shell is not None, "AirMagics needs an IPython shell"
        return self.shell.user_ns

    # -- commands ------------------------------------------------------------------------

    def _train(self, args: argparse.Namespace, cell: str) -> None:
        from air_sdk.client.client import job_spec
        from air_sdk.notebook.capture import DEFAULT_MAX_VALUE_BYTES, collect_files, package_cell

        if not cell.strip():
            raise UsageError("the cell is empty: write the training code below `%%air train`")
        fields = _spec_fields(args)
        try:
            job_spec(code="pass", **fields)  # bad options fail before any packaging
        except SpecError as exc:
            raise UsageError(f"{exc}\nchange the %%air train options") from None
        workdir = Path(args.workdir).expanduser() if args.workdir else Path.cwd()
        if not workdir.is_dir():
            raise UsageError(f"--workdir {args.workdir}: not a directory")
        max_value = args.max_value_mib << 20 if args.max_value_mib else DEFAULT_MAX_VALUE_BYTES
        package = package_cell(cell, self._user_ns, max_value_bytes=max_value)
        extra = collect_files(args.files or (), Path.cwd())
        clash = sorted(set(extra) & set(package.files))
        if clash:
            raise UsageError(f"--files: {clash[0]} is a name AIR uses for the cell; rename it")
        spec = job_spec(code=package.code, **fields)
        job = make_client(args.gateway).submit(
            spec, workdir=workdir, extra_files={**extra, **package.files}
        )
        self._user_ns[JOB_VARIABLE] = job
        show_monitor(job, **_monitor_options(args))
        if args.wait:
            _wait(job)

    def _gateway(self, args: argparse.Namespace) -> None:
        from air_sdk.config import air_home, default_gateway_port, write_client_config
        from air_sdk.gateway.server import (
            GatewayOptions,
            running_gateway,
            start_detached,
            stop_detached,
        )

        action = args.args[0]
        if action not in GATEWAY_ACTIONS:
            raise UsageError(
                f"%air gateway {action}: unknown action; use one of {', '.join(GATEWAY_ACTIONS)}"
            )
        home = Path(args.home).expanduser() if args.home else air_home()
        running = running_gateway(home)
        if action == "stop":
            if stop_detached(home):
                print(f"stopped the gateway (pid {running.pid if running else '?'}) of {home}")
            else:
                print(f"no gateway is running from {home}")
            return
        if action == "status":
            if running is not None:
                client = make_client(running.url, running.token or None, max_attempts=1)
            else:
                client = make_client(args.gateway, max_attempts=1)
            print(_gateway_status(client, running.pid if running else None))
            return
        if running is not None:
            write_client_config(running.url, running.token)
            print(
                f"a gateway already runs at {running.url} (pid {running.pid}, home {home});"
                " reusing it. Client() and %%air train use it."
            )
            return
        opts = GatewayOptions(
            port=args.port or default_gateway_port(),
            home=home,
            num_nodes=args.nodes or DEFAULT_VIRTUAL_NODES,
            slots_per_node=args.slots_per_node,
        )
        if _answers(opts.url):
            print(
                f"a gateway already answers at {opts.url} (not started from {home}); reusing it."
                " If Client() cannot authenticate, set AIR_TOKEN or use --port for a new one."
            )
            return
        process = start_detached(opts)
        write_client_config(process.url, process.token)
        print(
            f"gateway running at {process.url} (pid {process.pid}, {opts.num_nodes} virtual"
            f" nodes; home {home}; log {process.log_path}). It outlives this kernel;"
            " stop it with %air gateway stop."
        )

    def _logs(self, args: argparse.Namespace) -> None:
        from air_sdk.client import Job

        job = Job(make_client(args.gateway), args.args[0])
        lines = job.logs(rank=args.rank, tail=args.tail)
        if not lines:
            print(f"no output from job {job.id} yet")
        for entry in lines:
            print(f"[rank {entry.rank}] {entry.text}")

    def _cancel(self, args: argparse.Namespace) -> None:
        from air_sdk.client import Job

        record = Job(make_client(args.gateway), args.args[0]).cancel()
        if record.state.terminal and record.state is not JobState.CANCELLED:
            print(f"job {record.id} had already ended: {record.state.value}")
        else:
            print(f"cancel requested for job {record.id} (now {record.state.value})")


# -- helpers -------------------------------------------------------------------------------


def _render_as_one_line(exc: AirError) -> None:
    """IPython shows an exception through its `_render_traceback_` when it has one: an
    AIR error (what to change) reads better as one line than as a traceback of the SDK."""
    line = f"{type(exc).__name__}: {exc}"
    exc._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]


def _parse(line: str) -> argparse.Namespace:
    # magic_arguments' own parse_argstring keeps the quotes around `--name "my run"`;
    # split as a shell would (posix rules, except on Windows where `\\` is a path).
    argv = arg_split(line, posix=os.name == "posix", strict=True)
    parser: argparse.ArgumentParser = AirMagics.air.parser
    return parser.parse_args(argv)


def _check_applicable(args: argparse.Namespace, cell: str | None) -> None:
    command = args.command
    if command == "train" and cell is None:
        raise UsageError(
            "`train` runs a cell: put `%%air train [options]` on the first line of the cell"
            " that holds the training code"
        )
    if command != "train" and cell is not None:
        raise UsageError(f"`%%air {command}` takes no cell: use the line magic `%air {command}`")
    for dest, commands in _OPTION_COMMANDS.items():
        value = getattr(args, dest)
        if value is not None and value is not False and command not in commands:
            flag = "--" + dest.replace("_", "-")
            where = " and ".join(f"`{c}`" for c in commands)
            raise UsageError(f"{flag} applies to {where}, not to `{command}`")
    expected = _NUM_ARGS[command]
    if len(args.args) != expected:
        if expected == 0:
            raise UsageError(
                f"`{command}` takes no arguments, got {' '.join(args.args)!r}"
                " (options start with --)"
            )
        raise UsageError(f"`%air {command}` needs {_ARG_HINT[command]}")


def _spec_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": args.name or DEFAULT_JOB_NAME,
        "env": dict(args.env or ()),
        "resources": {
            "nodes": args.nodes or 1,
            "procs_per_node": args.procs_per_node or 1,
            "gpus_per_node": args.gpus_per_node or 0,
        },
        "max_restarts": args.max_restarts or 0,
        "pool": args.pool or "default",
        "priority": args.priority or "normal",
    }
    if args.accelerator:
        fields["accelerator"] = args.accelerator
    if args.checkpoint_every is not None:
        fields["checkpoint"] = {"every_steps": args.checkpoint_every}
    return fields


def _monitor_options(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.total_steps is None else {"total_steps": args.total_steps}


def _wait(job: Job) -> None:
    try:
        record = job.wait()
    except KeyboardInterrupt:
        print(
            f"stopped waiting; job {job.id} keeps running (%air attach {job.id} to watch it,"
            f" %air cancel {job.id} to stop it)"
        )
        return
    print(_status_text(record))
    if record.state is JobState.FAILED:
        failed = JobFailedError(job.id, record.state_reason or "see %air logs " + job.id)
        raise failed


def _answers(url: str) -> bool:
    try:
        make_client(url, max_attempts=1).health()
    except AirError:
        return False
    return True


def _gateway_status(client: Client, pid: int | None) -> str:
    try:
        health = client.health()
    except TransportError:
        return f"no gateway at {client.gateway_url}; start one with %air gateway start"
    lines = [
        f"gateway {client.gateway_url} is up (version {health.version}"
        + (f", pid {pid})" if pid else ")")
    ]
    try:
        inventory = client.inventory()
    except AirError as exc:
        lines.append(f"  cannot list nodes: {exc}")
        return "\n".join(lines)
    for node in inventory.nodes:
        gpus = f", {len(node.gpus)} GPUs" if node.gpus else ""
        jobs = f"  jobs: {', '.join(node.jobs)}" if node.jobs else ""
        health_note = "" if node.healthy else " (unhealthy)"
        lines.append(
            f"  {node.name}: {node.used_slots}/{node.slots} slots{gpus}{health_note}{jobs}"
        )
    return "\n".join(lines)


def _age(seconds: float) -> str:
    seconds = max(seconds, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _status_text(record: JobRecord) -> str:
    resources = record.spec.resources
    lines = [
        f"job {record.id} ({record.name}): {record.state.value}"
        + (f" - {record.state_reason}" if record.state_reason else ""),
        f"  {resources.nodes} node(s) x {resources.ranks_per_node} rank(s); attempt"
        f" {record.attempt}, {record.num_restarts} restart(s)",
    ]
    failure = record.failure
    if failure is not None:
        how = ""
        if failure.rank is not None:
            how = f" rank {failure.rank} " + (
                f"signal {failure.signal}" if failure.signal else f"exit code {failure.exit_code}"
            )
        lines.append(f"  failed (attempt {failure.attempt}):{how}: {failure.reason}")
        lines.extend(f"    {text}" for text in failure.log_tail[-10:])
    return "\n".join(lines)


class _JobsTable:
    """`%air jobs`: an HTML table in the notebook, plain text elsewhere."""

    COLUMNS = ("ID", "NAME", "STATE", "NODES x RANKS", "ATTEMPT", "AGE")

    def __init__(self, records: Sequence[JobRecord]) -> None:
        now = time.time()
        self.rows = [
            (
                r.id,
                r.name,
                r.state.value,
                f"{r.spec.resources.nodes} x {r.spec.resources.ranks_per_node}",
                str(r.attempt),
                _age(now - r.created_at),
            )
            for r in records
        ]

    def __repr__(self) -> str:
        if not self.rows:
            return "no jobs"
        widths = [max(len(row[i]) for row in [self.COLUMNS, *self.rows]) for i in range(6)]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [self.COLUMNS, *self.rows]
        )

    def _repr_html_(self) -> str:
        if not self.rows:
            return "<p>no jobs</p>"
        head = "".join(f"<th>{c}</th>" for c in self.COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in self.rows
        )
        return (
            f'<table class="air-jobs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        )


def _show_jobs(records: Sequence[JobRecord]) -> None:
    display(_JobsTable(records))
