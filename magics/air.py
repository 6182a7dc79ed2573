"""`%%air train` and the `%air` line magics: parse, one SDK call, show.

    %air gateway start              # an embedded gateway for this notebook (reused if up)
    %%air train --nodes 2 --env LR=0.1
    ...training code, run on every rank...
    %air jobs / %air status JOB / %air logs JOB --rank 1 --tail 20 / %air cancel JOB
    %air attach JOB                 # the monitor again, e.g. after a kernel restart

`%%air train` packages the cell (`air_sdk.notebook.capture`), submits it
(`air_sdk.notebook.submit`, the path `@air_sdk.distributed` takes too) and
returns at once with the live monitor displayed, so the kernel stays free and
the monitor's Cancel button works; `--wait` blocks until the job ends. The job
is stored as `_air_job` in the notebook. Every call to the gateway goes through
`make_client` (tests replace it); the monitor is shown by `show_monitor`.

Thin by design: the job flags are made from the one declaration of job options
(`air_sdk.client.options`); what `train` does is `air_sdk.notebook.submit`,
what the line magics print is `air_sdk.notebook.job_views`, and `gateway start`
goes through `air_sdk.client.local_gateway` (this module never imports the gateway).
AIR errors show as one line (`AirError._render_traceback_`); this module patches no
exception.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments
from IPython.display import display
from IPython.utils.process import arg_split

from air_sdk.client.options import CELL_OPTIONS, JobOption
from air_sdk.errors import AirError, CellCaptureError, SpecError
from air_sdk.notebook.job_views import JobsTable, gateway_status_text, job_status_text
from air_sdk.schema.state import JobState
from air_sdk.text import plural

if TYPE_CHECKING:
    from air_sdk.client import Client, Job

__all__ = ["AirMagics", "make_client", "show_monitor"]

COMMANDS = ("train", "gateway", "jobs", "status", "logs", "cancel", "attach")
GATEWAY_ACTIONS = ("start", "stop", "status")
#: the name `%%air train` and `%air attach` bind the job to in the notebook
JOB_VARIABLE = "_air_job"
DEFAULT_VIRTUAL_NODES = 2

# option dest -> the commands it applies to (every job option: `train`)
_OPTION_COMMANDS: dict[str, tuple[str, ...]] = {
    **{option.name: ("train",) for option in CELL_OPTIONS},
    "files": ("train",),
    "max_value_mib": ("train",),
    "wait": ("train",),
    "total_steps": ("train", "attach"),  # a job option; attach's monitor takes it too
    "nodes": ("train", "gateway"),
    "slots_per_node": ("gateway",),
    "port": ("gateway",),
    "home": ("gateway",),
    "rank": ("logs",),
    "tail": ("logs",),
    "limit": ("jobs",),
}
# how many positional arguments each command takes
_NUM_ARGS: dict[str, int | tuple[int, int]] = {
    "train": 0,
    "gateway": 1,
    "jobs": 0,
    "status": (0, 1),
    "logs": 1,
    "cancel": 1,
    "attach": 1,
}
_ARG_HINT = {
    "gateway": "start, stop or status (e.g. %air gateway start)",
    "status": "at most a job id (e.g. %air status train-5d41402a; without one: your newest)",
    "logs": "a job id (e.g. %air logs train-5d41402a --tail 20)",
    "cancel": "a job id (e.g. %air cancel train-5d41402a)",
    "attach": "a job id (e.g. %air attach train-5d41402a)",
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


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


_number.__name__ = "number"


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE (for example --env LR=0.1; IPython expands $var there)"
        )
    return key.strip(), value


_F = TypeVar("_F", bound=Callable[..., Any])

#: what the magic adds to an option's declared help
_MAGIC_NOTES = {
    "nodes": "With `gateway start`: virtual nodes to split this machine into (default 2).",
}


def _job_option_kwargs(option: JobOption) -> dict[str, Any]:
    """argparse keywords of one declared job option (air_sdk/client/options.py).

    Every default is None, so `_check_applicable` can tell a given option."""
    info = option.info
    help_text = info.help
    if info.default is not None:
        help_text += f" (default {info.default})"
    note = _MAGIC_NOTES.get(option.name)
    if note:
        help_text += f" {note}"
    kwargs: dict[str, Any] = {"help": help_text, "default": None}
    if info.metavar:
        kwargs["metavar"] = info.metavar
    if option.choices:
        kwargs["choices"] = option.choices
    elif option.is_mapping:
        kwargs.update(type=_env_pair, action="append")
    elif option.is_list:
        kwargs["action"] = "append"
    elif option.type is int:
        kwargs["type"] = _count(info.minimum if info.minimum is not None else -(2**63))
    elif option.type is float:
        kwargs["type"] = _number
    return kwargs


def _job_option_arguments(func: _F) -> _F:
    """One `@argument` per declared job option, in declaration order."""
    for option in reversed(CELL_OPTIONS):  # construct_parser reads them last-applied first
        func = argument(*option.flags, **_job_option_kwargs(option))(func)
    return func


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
    @_job_option_arguments
    @argument(
        "--files",
        nargs="+",
        action="extend",
        metavar="PATH",
        help="Extra files or directories to send (relative to the working directory; those outside it land at the top of the bundle).",
    )
    @argument(
        "--max-value-mib",
        type=_count(1),
        metavar="MIB",
        help="Largest notebook value that may travel with the cell, pickled (default 64).",
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
        help="Rank slots per virtual node (default: its GPUs, or all cores shared by the nodes).",
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
        if args.command == "train":
            assert cell is not None
            self._train(args, cell)
        elif args.command == "gateway":
            self._gateway(args)
        elif args.command == "jobs":
            display(JobsTable(make_client(args.gateway).jobs(limit=args.limit or 20)))
        elif args.command == "status":
            self._status(args)
        elif args.command == "logs":
            self._logs(args)
        elif args.command == "cancel":
            self._cancel(args)
        elif args.command == "attach":
            job = make_client(args.gateway).job(args.args[0])
            self._user_ns[JOB_VARIABLE] = job
            show_monitor(job, **_monitor_options(args))

    @property
    def _user_ns(self) -> dict[str, Any]:
        assert self.shell is not None, "AirMagics needs an IPython shell"
        return self.shell.user_ns

    # -- commands ------------------------------------------------------------------------

    def _train(self, args: argparse.Namespace, cell: str) -> None:
        from air_sdk.notebook.submit import submit_cell, wait_for_end

        options = {option.name: getattr(args, option.name) for option in CELL_OPTIONS}
        if options["env"] is not None:
            options["env"] = dict(options["env"])
        try:
            job = submit_cell(
                make_client(args.gateway),
                cell,
                self._user_ns,
                files=args.files or (),
                max_value_bytes=args.max_value_mib << 20 if args.max_value_mib else None,
                **options,
            )
        except CellCaptureError:
            raise  # a value of the notebook that cannot travel: its own one-line message
        except SpecError as exc:
            raise UsageError(f"{exc}\nchange the %%air train options") from None
        self._user_ns[JOB_VARIABLE] = job
        show_monitor(job, **_monitor_options(args))
        if args.wait:
            wait_for_end(job)

    def _gateway(self, args: argparse.Namespace) -> None:
        from air_sdk.client import local_gateway
        from air_sdk.config import air_home, configured_gateway_port

        action = args.args[0]
        if action not in GATEWAY_ACTIONS:
            raise UsageError(
                f"%air gateway {action}: unknown action; use one of {', '.join(GATEWAY_ACTIONS)}"
            )
        home = Path(args.home).expanduser() if args.home else air_home()
        if action == "stop":
            _stop_own_gateway(home)
            return
        if action == "status":
            running = local_gateway.running_gateway(home)
            if running is not None:
                client = make_client(running.url, running.token or None, max_attempts=1)
            else:
                client = make_client(args.gateway, max_attempts=1)
            print(gateway_status_text(client, running.pid if running else None))
            return
        options: dict[str, Any] = {
            "home": home,
            "num_nodes": args.nodes or DEFAULT_VIRTUAL_NODES,
            "slots_per_node": args.slots_per_node,
        }
        port = args.port or configured_gateway_port()
        if port is not None:  # asked for: a taken port is an error naming its holder
            options["port"] = port
        try:
            gw = local_gateway.ensure_local_gateway(**options)
        except AirError as exc:
            raise UsageError(str(exc)) from None
        assert gw.process is not None
        if gw.how == "running":
            _check_shape(gw.process, args, home)
            print(
                f"a gateway already runs at {gw.url} (pid {gw.process.pid}, home {home});"
                " reusing it. Client() and %%air train use it."
                + ("" if gw.process.pid in _STARTED.get(home, ()) else _NOT_OURS)
            )
            return
        _STARTED.setdefault(home, set()).add(gw.process.pid)
        if gw.process.port_note:
            print(gw.process.port_note)
        print(
            f"gateway running at {gw.url} (pid {gw.process.pid},"
            f" {args.nodes or DEFAULT_VIRTUAL_NODES} virtual nodes; home {home};"
            f" log {gw.process.log_path}). It outlives this kernel;"
            " stop it with %air gateway stop."
        )

    def _status(self, args: argparse.Namespace) -> None:
        client = make_client(args.gateway)
        if args.args:
            print(job_status_text(client.job_record(args.args[0])))
            return
        newest = client.newest_job()  # as `air status`: the newest job by default
        if newest is None:
            print(f"you have no jobs on {client.gateway_url} yet: submit one with %%air train")
            return
        print(f"job {newest.id}: your newest (%air status JOB for another)")
        print(job_status_text(newest))

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
    if isinstance(expected, tuple):  # optional positional: in range, or the hint
        if not expected[0] <= len(args.args) <= expected[1]:
            raise UsageError(f"`%air {command}` takes {_ARG_HINT[command]}")
    elif len(args.args) != expected:
        if expected == 0:
            raise UsageError(
                f"`{command}` takes no arguments, got {' '.join(args.args)!r}"
                " (options start with --)"
            )
        raise UsageError(f"`%air {command}` needs {_ARG_HINT[command]}")


def _monitor_options(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.total_steps is None else {"total_steps": args.total_steps}


#: home -> pids of the gateways this kernel started: `%air gateway stop` stops only those
_STARTED: dict[Path, set[int]] = {}
_NOT_OURS = " (It was started outside this notebook: %air gateway stop leaves it running.)"


def _check_shape(running: Any, args: argparse.Namespace, home: Path) -> None:
    """Refuse to reuse a gateway whose nodes or slots differ from what the cell asked for
    (a later 4-rank cell would fail on it, far from the cause)."""
    if args.nodes is None and args.slots_per_node is None:
        return
    nodes = make_client(running.url, running.token or None, max_attempts=1).inventory().nodes
    slots = sorted({n.slots for n in nodes})
    wrong = []
    if args.nodes is not None and args.nodes != len(nodes):
        wrong.append(f"{plural(len(nodes), 'virtual node')}, not {args.nodes}")
    if args.slots_per_node is not None and slots != [args.slots_per_node]:
        have = plural(slots[0], "slot") if len(slots) == 1 else "/".join(map(str, slots)) + " slots"
        wrong.append(f"{have} per node, not {args.slots_per_node}")
    if wrong:
        stop = (
            "%air gateway stop"
            if running.pid in _STARTED.get(home, ())
            else "`air gateway stop` (it was started outside this notebook)"
        )
        raise UsageError(
            f"a gateway already runs from {home} at {running.url} (pid {running.pid}) with "
            + " and ".join(wrong)
            + f": stop it with {stop} and run this cell again, or give this notebook a"
            " gateway of its own with --home DIR"
        )


def _stop_own_gateway(home: Path) -> None:
    from air_sdk.client import local_gateway

    running = local_gateway.running_gateway(home)
    if running is None:
        print(f"no gateway is running from {home}")
        return
    if running.pid not in _STARTED.get(home, ()):
        print(
            f"the gateway at {running.url} (pid {running.pid}, home {home}) was not started"
            " by this notebook: left running. Stop it with `air gateway stop` in a terminal"
            " (or `!air gateway stop` here)."
        )
        return
    local_gateway.stop_detached(home)
    _STARTED[home].discard(running.pid)
    print(f"stopped the gateway (pid {running.pid}) of {home}")
