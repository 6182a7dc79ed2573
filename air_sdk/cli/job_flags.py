"""`air submit`'s job flags, made from the one declaration of job options
(`air_sdk.client.options.JobOptions`): one typer option per entry, same name,
help and default.

Example:
    >>> @with_job_options
    ... def submit(script: str, **options: Any) -> None: ...
    >>> [p for p in inspect.signature(submit).parameters][:3]
    ['script', 'nodes', 'procs_per_node']
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from air_sdk.cli._common import choices_enum, parse_env
from air_sdk.client.options import JOB_OPTIONS, JobOption

__all__ = ["typer_parameter", "with_job_options"]

_F = TypeVar("_F", bound=Callable[..., Any])


def typer_parameter(option: JobOption) -> inspect.Parameter:
    """The keyword-only parameter typer turns into `option`'s flag.

    Example:
        >>> from air_sdk.client.options import JOB_OPTIONS
        >>> typer_parameter(JOB_OPTIONS[0]).default
        1
    """
    info = option.info
    kwargs: dict[str, Any] = {"help": info.help, "rich_help_panel": info.group}
    if info.metavar:
        kwargs["metavar"] = info.metavar
    default: Any = info.default
    annotation: Any
    if option.choices:
        annotation = choices_enum(option.name.title().replace("_", ""), option.choices)
        kwargs["case_sensitive"] = False
        default = annotation(default)
    elif option.is_mapping:
        annotation = list[str] | None  # KEY=VALUE, repeated; parsed in `with_job_options`
        kwargs["show_default"] = False
    elif option.is_list:
        annotation = list[str] | None  # NAME, repeated (or NAME,NAME): split by the client
        kwargs["show_default"] = False
    elif option.is_path:
        annotation = Path | None
        kwargs.update(exists=True, file_okay=False, show_default=False)
    elif default is None:
        annotation = option.type | None
        kwargs["show_default"] = False
    else:
        annotation = option.type
    # No min= here: out-of-range values reach JobSpec validation, which names the field
    # in one `error: invalid job spec: ...` line with everything else that is wrong.
    return inspect.Parameter(
        option.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, typer.Option(*option.flags, **kwargs)],
    )


def with_job_options(fn: _F) -> _F:
    """Give a typer command every job option as a flag; `fn` receives them as keyword
    arguments with SDK values (env as a dict, priority as a string).

    `fn` must take `**options`; its own parameters come first in `--help`.
    """
    signature = inspect.signature(fn, eval_str=True)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    added = [typer_parameter(option) for option in JOB_OPTIONS]
    by_name = {option.name: option for option in JOB_OPTIONS}

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        for name, value in list(kwargs.items()):
            option = by_name.get(name)
            if option is None:
                continue
            if isinstance(value, Enum):
                kwargs[name] = value.value
            elif option.is_mapping:
                kwargs[name] = parse_env(value)
        return fn(*args, **kwargs)

    parameters = [*own, *added]
    command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command  # type: ignore[return-value]
