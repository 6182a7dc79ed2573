"""Job options, declared once: `JobOptions`.

Every option a user sets when submitting a job is one entry of the `JobOptions`
TypedDict: its name, its type and, in an `Option`, its default, help text and
where it goes in a `JobSpec`. Three faces are made from it and nothing else:

- the SDK's keyword arguments: `Client.submit_script(script, **options)` and
  `air_sdk.notebook.submit.submit_cell(...)`, `submit_package(...)` and
  `@air_sdk.distributed(...)` take `**options: Unpack[JobOptions]`, so type checkers
  and IDEs see every option;
- the CLI's `air submit` flags (`air_sdk.cli.job_flags`, typer);
- the `%%air train` flags (`magics.air`, IPython magic_arguments), except options
  declared `cell=False` (`module`: a cell is its own program).

To add an option, add one entry here (with `spec=` naming the `JobSpec` field it
sets); the three faces, their help and `tests/unit/client/test_job_options.py`
follow. Options with `spec=None` are read by the submitting code itself
(`workdir`: what is packaged).

Example:
    >>> job_spec_fields({"nodes": 2, "tp": 2, "checkpoint_every": 50})
    {'resources': {'nodes': 2}, 'parallelism': {'tp': 2}, 'checkpoint': {'every_steps': 50}}
    >>> [o.flag for o in JOB_OPTIONS][:3]
    ['--nodes', '--procs-per-node', '--gpus-per-node']
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict, get_args, get_origin, get_type_hints

from air_sdk.errors import SpecError
from air_sdk.schema.spec import Priority

__all__ = [
    "CELL_OPTIONS",
    "JOB_OPTIONS",
    "PARALLELISM",
    "JobOption",
    "JobOptions",
    "Option",
    "job_spec_fields",
    "shell_env",
]


#: the `--help` heading of the mesh sizes (JobSpec.parallelism)
PARALLELISM = "Parallelism (device mesh sizes)"


@dataclass(frozen=True, kw_only=True)
class Option:
    """How one job option looks to users and where it lands in a `JobSpec`.

    Example:
        >>> Option(default=1, help="Pipeline stages.", spec="parallelism.pp").spec
        'parallelism.pp'
    """

    #: the value when the option is not given (the JobSpec default, or None: derived)
    default: Any = None
    #: one sentence or two for `--help`; the default is shown by each face
    help: str
    #: dotted path of the JobSpec field it sets; None: read by the submitting code
    spec: str | None = None
    #: a one-letter alias, e.g. "-n"
    short: str | None = None
    #: the placeholder in help ("N", "KEY=VALUE")
    metavar: str | None = None
    #: smallest value a whole-number option takes (the flags refuse less at once)
    minimum: int | None = None
    #: the heading it is listed under in `--help`
    group: str = "Job"
    #: also a `%%air train` flag; False for what names the program to run (a cell is
    #: its own program)
    cell: bool = True


class JobOptions(TypedDict, total=False):
    """The options of a job, as keyword arguments (every one optional)."""

    nodes: Annotated[
        int,
        Option(
            default=1,
            spec="resources.nodes",
            short="-n",
            metavar="N",
            minimum=1,
            help="Nodes, gang-scheduled: all of them start together or none does.",
        ),
    ]
    procs_per_node: Annotated[
        int,
        Option(
            default=1,
            spec="resources.procs_per_node",
            metavar="N",
            minimum=1,
            help="Ranks per node.",
        ),
    ]
    gpus_per_node: Annotated[
        int,
        Option(
            default=0,
            spec="resources.gpus_per_node",
            metavar="N",
            minimum=0,
            help="GPUs per node, one rank each; 0 runs on CPU.",
        ),
    ]
    name: Annotated[
        str | None,
        Option(
            spec="name",
            metavar="NAME",
            help="Job name, 1-63 of [A-Za-z0-9._-] (default: the script's name, or"
            " `cell` for a notebook cell).",
        ),
    ]
    env: Annotated[
        Mapping[str, str] | None,
        Option(
            spec="env",
            short="-e",
            metavar="KEY=VALUE",
            help="Env var for every rank; repeat for more. Nothing else of your"
            " environment travels.",
        ),
    ]
    env_from_shell: Annotated[
        Sequence[str] | None,
        Option(
            spec="env",
            metavar="NAME",
            help="Copy these variables from your shell into every rank's env (repeat, or"
            " NAME,NAME). Your shell's environment is not forwarded by default: the job runs"
            " on other machines and later, secrets would land in the job record, and the"
            " spec alone should say what a run saw.",
        ),
    ]
    max_restarts: Annotated[
        int,
        Option(
            default=0,
            spec="max_restarts",
            metavar="N",
            minimum=0,
            help="Relaunches after a failure, each from the last committed checkpoint.",
        ),
    ]
    checkpoint_every: Annotated[
        int | None,
        Option(
            spec="checkpoint.every_steps",
            metavar="STEPS",
            minimum=1,
            help="Checkpoint every STEPS steps: ranks get AIR_CHECKPOINT_EVERY, and"
            " `air.checkpoint.due(step)` is true every STEPS steps.",
        ),
    ]
    total_steps: Annotated[
        int | None,
        Option(
            spec="total_steps",
            metavar="N",
            minimum=1,
            help="Steps of the run, for the progress bar and ETA of every view (the"
            " monitor, --follow, a later attach); `air.log(..., total_steps=N)` from a"
            " rank wins.",
        ),
    ]
    checkpoint_dir: Annotated[
        str | None,
        Option(
            spec="checkpoint.dir",
            metavar="DIR",
            help="Where ranks write and resume checkpoints (AIR_CHECKPOINT_DIR,"
            " air.checkpoint): an absolute path every node mounts, or an fsspec URL (default:"
            " <gateway home>/jobs/<job>/checkpoints). Name an earlier job's directory to resume"
            " from its checkpoints, e.g. under another layout. The gateway may refuse a path"
            " outside the roots its operator allows.",
        ),
    ]
    output_dir: Annotated[
        str | None,
        Option(
            spec="output_dir",
            metavar="DIR",
            help="Where ranks keep their outputs (AIR_OUTPUT_DIR, air.output_dir()): an"
            " absolute path every node mounts (default: <gateway home>/outputs/<job>, listed"
            " and fetched with `air outputs JOB`, kept by `air gc`). Relative paths in a job"
            " land in its code copy, which `air gc` deletes.",
        ),
    ]
    export: Annotated[
        Sequence[str] | None,
        Option(
            spec="export",
            metavar="TO[=DEST]",
            help="Forward the job's air.log metrics, checkpoints and final state to a tracker:"
            " mlflow[=TRACKING_URI], wandb[=PROJECT] or tensorboard (repeat, or TO,TO). The"
            " gateway does it from the event log, so ranks pay nothing; credentials"
            " (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN) go in --env and are kept secret.",
        ),
    ]
    pool: Annotated[
        str,
        Option(
            default="default",
            spec="pool",
            metavar="POOL",
            help="Node pool to run in; 'any' lets the scheduler choose.",
        ),
    ]
    priority: Annotated[
        Priority,
        Option(
            default="normal",
            spec="priority",
            help="Priority class: low, normal or high (high may preempt lower classes).",
        ),
    ]
    accelerator: Annotated[
        str | None,
        Option(
            spec="accelerator",
            metavar="TYPE",
            help="Accelerator type: a100, h100, cpu; gpu for any GPU (default: what the pool has).",
        ),
    ]
    timeout: Annotated[
        float | None,
        Option(
            spec="timeout_s",
            metavar="SECONDS",
            help="Wall-clock limit of the whole job in seconds; past it the job is"
            " stopped and FAILED (default: none).",
        ),
    ]
    memory_limit: Annotated[
        str | None,
        Option(
            spec="limits.memory",
            metavar="SIZE",
            help="Memory all the job's processes on a node may use together (4GiB, 512MiB);"
            " past it the job fails with 'memory limit', not restarted (default: the"
            " gateway's cap, if any).",
        ),
    ]
    max_processes: Annotated[
        int | None,
        Option(
            spec="limits.processes",
            metavar="N",
            minimum=1,
            help="Processes and threads the job may run on a node together; past it the job"
            " fails with 'process limit' (default: the gateway's cap, if any).",
        ),
    ]
    disk_limit: Annotated[
        str | None,
        Option(
            spec="limits.disk",
            metavar="SIZE",
            help="Bytes the job may keep under its writable directories (code, attempts,"
            " checkpoints, outputs, /tmp); past it the job fails with 'disk limit' (default:"
            " the gateway's cap, if any).",
        ),
    ]
    dp_replicate: Annotated[
        int,
        Option(
            default=1,
            spec="parallelism.dp_replicate",
            group=PARALLELISM,
            metavar="N",
            minimum=1,
            help="Data-parallel replicas (HSDP's outer dimension).",
        ),
    ]
    dp_shard: Annotated[
        int,
        Option(
            default=-1,
            spec="parallelism.dp_shard",
            group=PARALLELISM,
            metavar="N",
            minimum=-1,
            help="Data-parallel shards (FSDP2); -1: what the other sizes leave. The five"
            " sizes multiply to nodes x ranks per node.",
        ),
    ]
    tp: Annotated[
        int,
        Option(
            default=1,
            spec="parallelism.tp",
            group=PARALLELISM,
            metavar="N",
            minimum=1,
            help="Tensor-parallel size; it must divide the ranks of one node.",
        ),
    ]
    pp: Annotated[
        int,
        Option(
            default=1,
            spec="parallelism.pp",
            group=PARALLELISM,
            metavar="N",
            minimum=1,
            help="Pipeline stages.",
        ),
    ]
    cp: Annotated[
        int,
        Option(
            default=1,
            spec="parallelism.cp",
            group=PARALLELISM,
            metavar="N",
            minimum=1,
            help="Context-parallel size (needs GPUs).",
        ),
    ]
    model: Annotated[
        str | None,
        Option(
            spec="model.preset",
            metavar="PRESET",
            help="What the job trains, as a planner preset (llama3-8b, llama3-70b, gpt2-124m;"
            " `air plan --help`): a GPU job whose layout cannot fit its GPUs is then refused"
            " at submit, with a layout that fits.",
        ),
    ]
    module: Annotated[
        str | None,
        Option(
            spec="module",
            short="-m",
            metavar="MODULE",
            cell=False,
            help="Run a module as `python -m MODULE` (torchrun's -m) instead of a script;"
            " it is imported from the workdir or the installed packages.",
        ),
    ]
    workdir: Annotated[
        str | Path | None,
        Option(
            metavar="DIR",
            help="Directory sent as the job's code (default: the working directory, or"
            " the script's own when it lies outside); .gitignore and .airignore apply.",
        ),
    ]


@dataclass(frozen=True)
class JobOption:
    """One entry of `JobOptions`, resolved: name, type and `Option`.

    Example:
        >>> by_name = {o.name: o for o in JOB_OPTIONS}
        >>> by_name["dp_shard"].flag, by_name["dp_shard"].info.default
        ('--dp-shard', -1)
        >>> by_name["priority"].choices
        ('low', 'normal', 'high')
    """

    name: str
    #: the annotation without `None` ("int", "Mapping[str, str]", a Literal ...)
    type: Any
    info: Option

    @property
    def flag(self) -> str:
        """The long flag, e.g. `--procs-per-node`."""
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        """The flag and its one-letter alias, if any."""
        return (self.flag, self.info.short) if self.info.short else (self.flag,)

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The allowed values of a Literal-typed option."""
        return get_args(self.type) if get_origin(self.type) is Literal else None

    @property
    def is_path(self) -> bool:
        """True for a directory option (given as a path)."""
        return self.type is Path or Path in get_args(self.type)

    @property
    def is_mapping(self) -> bool:
        """True for KEY=VALUE options (repeated on a command line)."""
        return get_origin(self.type) is Mapping

    @property
    def is_list(self) -> bool:
        """True for NAME options repeated on a command line (or NAME,NAME)."""
        return get_origin(self.type) is Sequence


def _resolve(typed_dict: type) -> tuple[JobOption, ...]:
    options = []
    for name, hint in get_type_hints(typed_dict, include_extras=True).items():
        base, *extras = get_args(hint)
        (info,) = [e for e in extras if isinstance(e, Option)]
        members = [a for a in get_args(base) if a is not type(None)]
        if get_origin(base) is not Literal and type(None) in get_args(base):
            base = members[0] if len(members) == 1 else base
        options.append(JobOption(name, base, info))
    return tuple(options)


#: every job option, in declaration order (the order of `--help`)
JOB_OPTIONS: tuple[JobOption, ...] = _resolve(JobOptions)
#: the options `%%air train` takes (a cell is its own program: no `module`)
CELL_OPTIONS: tuple[JobOption, ...] = tuple(o for o in JOB_OPTIONS if o.info.cell)
_BY_NAME = {o.name: o for o in JOB_OPTIONS}


def shell_env(
    names: Sequence[str] | str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables `names` (each may be "A,B") from `environ` (default: this process's
    environment), for `env_from_shell`. A name that is not set is a `SpecError`.

    Example:
        >>> shell_env(["LR", "WANDB_PROJECT,SEED"], {"LR": "0.1", "WANDB_PROJECT": "p", "SEED": "1"})
        {'LR': '0.1', 'WANDB_PROJECT': 'p', 'SEED': '1'}
        >>> shell_env(["NOPE"], {})
        Traceback (most recent call last):
        ...
        air_sdk.errors.SpecError: --env-from-shell NOPE: NOPE is not set in this shell; export it first, or pass a value with --env NOPE=VALUE
    """
    environ = os.environ if environ is None else environ
    wanted = [names] if isinstance(names, str) else list(names)
    env: dict[str, str] = {}
    for item in wanted:
        for name in (part.strip() for part in item.split(",")):
            if not name:
                continue
            if name not in environ:
                raise SpecError(
                    f"--env-from-shell {name}: {name} is not set in this shell; export it"
                    f" first, or pass a value with --env {name}=VALUE"
                )
            env[name] = environ[name]
    return env


def job_spec_fields(
    options: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The `JobSpec` fields that job options set, nested by their `spec` paths.

    Options left out or None keep the JobSpec default; options without a spec path
    (`workdir`) are the caller's to read. `env_from_shell` names are read from `environ`
    (default: this process's environment) into `env`; a name also given in `env` with
    another value is a `SpecError`. An unknown name is a `SpecError` that suggests the
    nearest known one.

    Example:
        >>> job_spec_fields({"nodes": 2, "name": None, "env": {"LR": "0.1"}})
        {'resources': {'nodes': 2}, 'env': {'LR': '0.1'}}
        >>> job_spec_fields({"node": 2})
        Traceback (most recent call last):
        ...
        air_sdk.errors.SpecError: unknown job option 'node' (did you mean 'nodes'?)
    """
    fields: dict[str, Any] = {}
    for name, value in options.items():
        option = _BY_NAME.get(name)
        if option is None:
            near = difflib.get_close_matches(name, list(_BY_NAME), n=1) or [
                known for known in _BY_NAME if name in known
            ]
            hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(_BY_NAME)}"
            raise SpecError(f"unknown job option {name!r} ({hint})")
        if value is None or option.info.spec is None:
            continue
        if option.is_list and option.info.spec == "env":  # env_from_shell: merged below
            continue
        *parents, leaf = option.info.spec.split(".")
        target = fields
        for part in parents:
            target = target.setdefault(part, {})
        if option.is_mapping:
            value = dict(value)
        elif option.is_list:
            value = [value] if isinstance(value, str) else list(value)
        target[leaf] = value
    names = options.get("env_from_shell")
    if names:
        env = fields.setdefault("env", {})
        for name, value in shell_env(names, environ).items():
            if env.get(name, value) != value:
                raise SpecError(
                    f"{name} is given both by --env and --env-from-shell with different"
                    " values: keep one"
                )
            env[name] = value
    return fields
