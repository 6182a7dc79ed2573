"""Submitting code from a notebook: a `%%air train` cell or an `@air_sdk.distributed`
call, packaged (`air_sdk.notebook.capture`) and submitted through one path.

What `%%air train` calls (the magic only parses its line) and what a decorated
function's call does; usable without IPython too, with any namespace dict. The job
options are those of `air_sdk.client.options.JobOptions` (the one declaration the
CLI's and the magic's flags are made from), as keyword arguments; they become
`JobSpec` fields through `job_spec_fields`. The package's bootstrap is the job's
`JobSpec.code`; its payload and any extra `files` are added to the bundle of
`workdir` (default: the working directory).

Examples marked `+SKIP` need a running gateway (and a notebook's namespace).

Example:
    >>> checked_job_fields({"nodes": 2, "timeout": 600}, default_name="cell")
    {'resources': {'nodes': 2}, 'timeout_s': 600, 'name': 'cell'}
    >>> job = submit_cell(Client(), "print(lr)", {"lr": 0.1}, nodes=2)  # doctest: +SKIP
    >>> wait_for_end(job)  # doctest: +SKIP
    job cell-3f2a (cell): SUCCEEDED
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from air_sdk.client.client import job_spec
from air_sdk.client.options import JobOptions, job_spec_fields
from air_sdk.errors import JobFailedError, SpecError
from air_sdk.notebook.job_views import job_status_text
from air_sdk.schema.state import JobState

if TYPE_CHECKING:
    from air_sdk.client import Client, Job
    from air_sdk.notebook.capture import CellPackage
    from air_sdk.schema.api import JobRecord

__all__ = [
    "DEFAULT_JOB_NAME",
    "checked_job_fields",
    "submit_cell",
    "submit_package",
    "wait_for_end",
]

#: the job name of a cell when none is given
DEFAULT_JOB_NAME = "cell"


def checked_job_fields(options: Mapping[str, Any], *, default_name: str) -> dict[str, Any]:
    """The `JobSpec` fields the job `options` set (`job_spec_fields`), with a name,
    checked as a whole spec: bad options fail here, before anything is packaged.

    Example:
        >>> checked_job_fields({"nodes": 0}, default_name="cell")
        Traceback (most recent call last):
        ...
        air_sdk.errors.SpecError: invalid job spec:
        resources.nodes: Input should be greater than or equal to 1
    """
    if options.get("module"):
        raise SpecError(
            "module= names a program to run, and a cell or a function is its own: leave it"
            " out (run a module with `air submit -m MODULE` or Client.submit_script(module=...))"
        )
    fields = job_spec_fields(options)
    fields.setdefault("name", default_name)
    job_spec(code="pass", **fields)
    return fields


def _workdir(options: Mapping[str, Any], option: str) -> Path:
    workdir = Path(options.get("workdir") or Path.cwd()).expanduser()
    if not workdir.is_dir():
        raise SpecError(f"{option} {workdir}: not a directory")
    return workdir


def submit_package(
    client: Client,
    package: CellPackage,
    *,
    files: Iterable[str | Path] = (),
    files_option: str = "--files",
    workdir_option: str = "--workdir",
    default_name: str = DEFAULT_JOB_NAME,
    **options: Unpack[JobOptions],
) -> Job:
    """Submit `package` with the job `options`; returns the `Job` at once.

    `files` (relative to the working directory) are added to the bundle of
    `options["workdir"]` (default: the working directory), beside the package's
    payload; messages name them as `files_option` and the workdir as `workdir_option`
    (the flag or argument the user gave them with).

    Raises:
        SpecError: a bad option, a workdir that is not a directory, a missing file
            or one named like the payload.
        BundleTooLargeError: the files or the workdir are over the bundle limit.

    Example:
        >>> package = package_cell("print(1)", {})  # doctest: +SKIP
        >>> submit_package(Client(), package, nodes=2, name="one").id  # doctest: +SKIP
        'one-5d41402a'
    """
    # Imported here: the bundle's readers are needed only once something is sent.
    from air_sdk.bundle import collect_files

    fields = checked_job_fields(options, default_name=default_name)
    workdir = _workdir(options, workdir_option)
    extra = collect_files(files, Path.cwd(), option=files_option)
    clash = sorted(set(extra) & set(package.files))
    if clash:
        raise SpecError(f"{files_option}: {clash[0]} is a name AIR uses for the code; rename it")
    spec = job_spec(code=package.code, **fields)
    return client.submit(spec, workdir=workdir, extra_files={**extra, **package.files})


def submit_cell(
    client: Client,
    cell: str,
    namespace: Mapping[str, Any],
    *,
    files: Iterable[str | Path] = (),
    max_value_bytes: int | None = None,
    **options: Unpack[JobOptions],
) -> Job:
    """Submit `cell` as a job that runs it on every rank; returns at once.

    What the cell uses from `namespace` travels with it (modules are imported again,
    functions, classes and values are pickled); `files` (relative to the working
    directory) and `options["workdir"]` (default: the working directory) are sent
    as its code. Bad options raise `SpecError` before anything is packaged; a value
    that cannot travel raises `CellCaptureError` before anything is uploaded.

    Example:
        >>> submit_cell(Client(), "   ", {})  # doctest: +SKIP
        Traceback (most recent call last):
        ...
        air_sdk.errors.SpecError: the cell is empty: write the training code below `%%air train`
    """
    from air_sdk.notebook.capture import package_cell
    from air_sdk.notebook.pickling import DEFAULT_MAX_VALUE_BYTES

    if not cell.strip():
        raise SpecError("the cell is empty: write the training code below `%%air train`")
    checked_job_fields(options, default_name=DEFAULT_JOB_NAME)  # before any packaging
    _workdir(options, "--workdir")
    limit = DEFAULT_MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes
    package = package_cell(cell, namespace, max_value_bytes=limit)
    return submit_package(client, package, files=files, **options)


def wait_for_end(job: Job, *, show: Callable[[str], None] = print) -> JobRecord | None:
    """Block until `job` ends and show its final state; raise `JobFailedError` if it
    failed. Ctrl-C (interrupting the kernel) stops waiting, not the job: None then.

    Example:
        >>> wait_for_end(job)  # doctest: +SKIP
        job cell-3f2a (cell): SUCCEEDED
    """
    try:
        record = job.wait()
    except KeyboardInterrupt:
        show(
            f"stopped waiting; job {job.id} keeps running (%air attach {job.id} to watch it,"
            f" %air cancel {job.id} to stop it)"
        )
        return None
    show(job_status_text(record))
    if record.state is JobState.FAILED:
        raise JobFailedError(job.id, record.state_reason or "see %air logs " + job.id)
    return record
