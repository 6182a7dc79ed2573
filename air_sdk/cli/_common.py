"""What every `air` command shares: consoles, exit codes, error printing, option types."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from air_sdk.errors import AirError, BundleError, ConfigError, SpecError

#: exit codes: 0 done, 1 the job or the gateway failed, 2 fix your command, 130 interrupted
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_table(table: Any) -> None:
    """Print a rich table whole: on a terminal at its width; in a pipe (80 columns to
    rich) as wide as its widest row, so no path is cut to "..." for `grep` or a script.
    """
    if console.is_terminal:
        console.print(table)
        return
    unbounded = console.options.update(max_width=100_000)
    needed = console.measure(table, options=unbounded).maximum
    narrow = console.width
    console.width = max(narrow, needed)
    try:
        console.print(table)
    finally:
        console.width = narrow


GatewayOption = Annotated[
    str | None,
    typer.Option(
        "--gateway",
        metavar="URL",
        help="Gateway URL (default: $AIR_GATEWAY_URL or ~/.config/air/config.toml).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

_F = TypeVar("_F", bound=Callable[..., Any])


def exit_code_for(exc: AirError) -> int:
    """2 for errors the user fixes in the command or its inputs, 1 otherwise.

    Example:
        >>> exit_code_for(SpecError("nodes: must be >= 1"))
        2
    """
    return EXIT_USAGE if isinstance(exc, SpecError | ConfigError | BundleError) else EXIT_FAILED


def one_line(message: str) -> str:
    """A multi-line message ("invalid job spec:\\nnodes: ...") as one line.

    Example:
        >>> one_line("invalid job spec:\\na: x\\nb: y")
        'invalid job spec: a: x; b: y'
    """
    first, *rest = [line.strip() for line in message.splitlines() if line.strip()] or [""]
    if not rest:
        return first
    return f"{first} {'; '.join(rest)}" if first.endswith(":") else "; ".join([first, *rest])


def flag_message(exc: AirError) -> str:
    """An invalid job spec said in the flags the user typed (`--nodes 0: must be at
    least 1`), not in the spec's field names and pydantic's words; other errors as
    they are.

    Example:
        >>> from air_sdk.client.client import job_spec
        >>> try:
        ...     job_spec(entrypoint="t.py", resources={"nodes": 0}, max_restarts=-2)
        ... except SpecError as exc:
        ...     print(flag_message(exc))
        --nodes 0: must be at least 1; --max-restarts -2: must be at least 0
    """
    from pydantic import ValidationError

    from air_sdk.client.client import validation_errors
    from air_sdk.client.options import JOB_OPTIONS

    cause = exc.__cause__
    if not isinstance(exc, SpecError) or not isinstance(cause, ValidationError):
        return str(exc)
    flags = {o.info.spec or o.name: o.flag for o in JOB_OPTIONS}
    said = []
    for loc, msg, err in validation_errors(cause):
        if err.get("type") in ("greater_than_equal", "less_than_equal"):
            bound = (err.get("ctx") or {}).get("ge", (err.get("ctx") or {}).get("le"))
            word = "least" if err["type"] == "greater_than_equal" else "most"
            msg = f"must be at {word} {bound}"
        value = err.get("input")
        if loc in flags and isinstance(value, int | float | str):
            said.append(f"{flags[loc]} {value}: {msg}")
        elif loc in flags:
            said.append(f"{flags[loc]}: {msg}")
        else:
            said.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(said)


def print_error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] [red]{escape(one_line(message))}[/]", soft_wrap=True)


def handle_errors(fn: _F) -> _F:
    """Print an `AirError` as one red `error: ...` line and exit 2 or 1; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AirError as exc:
            print_error(str(exc))
            raise typer.Exit(exit_code_for(exc)) from None

    return wrapper  # type: ignore[return-value]


def parse_env(values: Sequence[str] | None) -> dict[str, str]:
    """`KEY=VALUE` pairs from repeated `--env` options; a bad one is a usage error.

    Example:
        >>> parse_env(["A=1", "B=x=y"])
        {'A': '1', 'B': 'x=y'}
    """
    env: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(
                f"{item!r} is not KEY=VALUE (for example --env LR=0.1)", param_hint="'--env'"
            )
        env[key.strip()] = value
    return env


def choices_enum(name: str, choices: Sequence[str]) -> type[Enum]:
    """A str Enum of `choices`, for typer (which lists them in --help and checks them).

    Example:
        >>> [p.value for p in choices_enum("Priority", ["low", "high"])]
        ['low', 'high']
    """
    return Enum(name, {c: c for c in choices}, type=str)  # type: ignore[return-value]


def echo_json(data: Any) -> None:
    """Plain JSON on stdout (no rich wrapping or colour): for scripts and `jq`."""
    typer.echo(json.dumps(data, indent=2, sort_keys=False))
