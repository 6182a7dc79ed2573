"""`air gateway start|stop|status`: the embedded gateway on this machine.

`air gateway start` has one flag per `GatewayOptions` field (air_sdk/gateway_config.py),
made here from the model: a new field is a new flag with nothing to add. The
server code (`air_sdk.gateway.server`) is imported inside each command, so
`air --help` stays fast and nothing else in the CLI pulls in FastAPI or torch.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import typer
from annotated_types import Ge, Le
from pydantic import ValidationError
from rich.markup import escape

from air_sdk.cli._common import (
    EXIT_FAILED,
    GatewayOption,
    choices_enum,
    console,
    err_console,
    handle_errors,
)
from air_sdk.client.client import format_validation_error
from air_sdk.config import air_home
from air_sdk.errors import ConfigError
from air_sdk.gateway_config import GatewayOptions
from air_sdk.text import plural

__all__ = ["gateway_app"]

_F = TypeVar("_F", bound=Callable[..., Any])

gateway_app = typer.Typer(
    help="Run the embedded gateway (scheduler + resilient runner) on this machine.",
    no_args_is_help=True,
)

HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        metavar="DIR",
        help="Where the gateway keeps its database, bundles and jobs (default: $AIR_HOME).",
        show_default=False,
    ),
]


def _flag_parameter(name: str) -> inspect.Parameter | None:
    """The typer parameter of one `GatewayOptions` field (None for a hidden one).

    Every default is None: a flag left out keeps the model's default, or its
    `AIR_GATEWAY_*` env var; help shows the model's default.
    """
    field = GatewayOptions.model_fields[name]
    flag = GatewayOptions.flag_of(name)
    if flag.hidden:
        return None
    kwargs: dict[str, Any] = {"help": field.description, "show_default": False}
    if flag.metavar:
        kwargs["metavar"] = flag.metavar
    hint: Any = field.annotation
    members = [a for a in get_args(hint) if a is not type(None)]
    if type(None) in get_args(hint) and len(members) == 1:
        hint = members[0]
    default: Any = None
    if hint is bool:
        annotation: Any = bool  # an on-switch; off is the default
        default = False
    elif get_origin(hint) is tuple:
        annotation = list[str] | None  # repeat the flag
    elif get_origin(hint) is Literal:
        annotation = choices_enum(name.title().replace("_", ""), get_args(hint))
        kwargs["show_default"] = str(field.default)
    else:
        annotation = hint | None
        if field.default is not None and not field.default_factory:
            kwargs["show_default"] = str(field.default)
        for rule in field.metadata:
            if isinstance(rule, Ge):
                kwargs["min"] = rule.ge
            elif isinstance(rule, Le):
                kwargs["max"] = rule.le
    if flag.must_exist:
        kwargs.update(exists=True, dir_okay=False)
    names = (flag.name or "--" + name.replace("_", "-"),)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, typer.Option(*names, **kwargs)],
    )


def _with_gateway_options(fn: _F) -> _F:
    """Give `fn` one flag per `GatewayOptions` field; it receives `opts`, built from
    the flags given (an invalid combination is a `ConfigError` naming the field)."""
    params = [p for p in map(_flag_parameter, GatewayOptions.model_fields) if p is not None]
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(fn, eval_str=True).parameters.values()
        if p.name != "opts"
    ]
    names = {p.name for p in params}

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        given = {}
        for name in names:
            value = kwargs.pop(name)
            if value is None or value is False:
                continue
            given[name] = value.value if isinstance(value, Enum) else value
        try:
            opts = GatewayOptions(**given)
        except ValidationError as exc:
            raise ConfigError(f"bad gateway options:\n{format_validation_error(exc)}") from None
        return fn(opts=opts, **kwargs)

    parameters = [*params, *own]
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command  # type: ignore[return-value]


@gateway_app.command()
@handle_errors
@_with_gateway_options
def start(
    opts: GatewayOptions,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Run in the background and return.")
    ] = False,
) -> None:
    """Start a gateway; it writes the client config, so `air submit` works right away.

    Every option may also come from an env var: AIR_GATEWAY_PORT, AIR_GATEWAY_HOME ...
    """
    from air_sdk.gateway.server import oversubscription_warning, serve, start_detached

    warning = oversubscription_warning(opts)
    if warning is not None:
        err_console.print(f"[yellow]warning: {escape(warning)}[/]", soft_wrap=True)
    if not detach:
        try:
            serve(opts)
        except KeyboardInterrupt:
            pass
        return
    with console.status(f"starting a gateway on {opts.url} ..."):
        proc = start_detached(opts)
    if proc.port_note:
        err_console.print(f"[yellow]{escape(proc.port_note)}[/]", soft_wrap=True)
    custom_home = opts.home != air_home()
    console.print(
        f"gateway running at [bold]{proc.url}[/] (pid {proc.pid}, {plural(opts.num_nodes, 'node')})\n"
        f"  log:  {proc.log_path}\n  stop: air gateway stop"
        + (f" --home {opts.home}" if custom_home else ""),
        soft_wrap=True,
    )


@gateway_app.command()
@handle_errors
def stop(home: HomeOption = None) -> None:
    """Stop the background gateway started with `air gateway start --detach`; its jobs
    keep running (the next start re-attaches to them)."""
    from air_sdk.client.local_gateway import running_gateway, stop_detached

    root = home or air_home()
    proc = running_gateway(root)
    active = _active_jobs(proc.url, proc.token) if proc is not None else []
    if not stop_detached(root):
        console.print(f"no gateway is running from {root}")
        return
    console.print(f"stopped the gateway{f' (pid {proc.pid})' if proc else ''}")
    if active:
        shown = ", ".join(active[:5]) + (f" and {len(active) - 5} more" if len(active) > 5 else "")
        home_flag = f" --home {root}" if root != air_home() else ""
        console.print(
            f"{plural(len(active), 'job')} {'keeps' if len(active) == 1 else 'keep'} running"
            f" without it ({shown}): {'its' if len(active) == 1 else 'their'} processes do not"
            " need the gateway, and the next `air gateway start` re-attaches to"
            f" {'it' if len(active) == 1 else 'them'}."
            f" To stop {'it' if len(active) == 1 else 'them'}:"
            f" air gateway start --detach{home_flag} && air cancel --all",
            soft_wrap=True,
        )


def _active_jobs(url: str, token: str) -> list[str]:
    """Ids of the jobs that have not ended on the gateway at `url` ([] when it does not
    say: stopping goes ahead anyway)."""
    from air_sdk.cli.main import make_client
    from air_sdk.errors import AirError

    try:
        with make_client(url, token or None, max_attempts=1) as client:
            return [record.id for record in client.active_jobs()]
    except AirError:
        return []


@gateway_app.command()
@handle_errors
def status(home: HomeOption = None, gateway: GatewayOption = None) -> None:
    """Is a gateway up? Its URL, version and nodes."""
    from air_sdk.cli.main import make_client
    from air_sdk.client.local_gateway import running_gateway
    from air_sdk.errors import AirError, TransportError

    proc = None if gateway else running_gateway(home or air_home())
    # One try: "is it up?" should answer at once, not after a round of retries.
    if proc is not None:
        client = make_client(proc.url, proc.token or None, max_attempts=1)
    else:
        client = make_client(gateway, max_attempts=1)
    try:
        health = client.health()
    except TransportError:
        where = f" (pid {proc.pid} from {home or air_home()} is not answering)" if proc else ""
        console.print(
            f"[red]no gateway at {client.gateway_url}{where}[/]; start one with"
            " `air gateway start --detach`",
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_FAILED) from None
    except AirError as exc:
        console.print(f"[red]the gateway at {client.gateway_url}: {escape(str(exc))}[/]")
        raise typer.Exit(EXIT_FAILED) from None
    started = f", pid {proc.pid}, log {proc.log_path}" if proc else ""
    console.print(
        f"gateway [bold]{client.gateway_url}[/] is up (version {health.version}{started})",
        soft_wrap=True,
    )
    try:
        inventory = client.inventory()
    except AirError as exc:
        console.print(f"[yellow]cannot list nodes: {escape(str(exc))}[/]", soft_wrap=True)
        return
    for node in inventory.nodes:
        gpus = f", {plural(len(node.gpus), 'GPU')}" if node.gpus else ""
        health_note = "" if node.healthy else " [red](unhealthy)[/]"
        jobs = f"  jobs: {', '.join(node.jobs)}" if node.jobs else ""
        console.print(
            f"  {node.name}: {node.used_slots}/{plural(node.slots, 'slot')}{gpus}{health_note}{jobs}",
            soft_wrap=True,
        )
