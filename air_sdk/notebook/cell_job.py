"""A notebook cell as a job: package it with what it uses, submit it, wait for it.

What `%%air train` calls (the magic only parses its line); usable without IPython
too, with any namespace dict.

Examples marked `+SKIP` need a running gateway (and a notebook's namespace).

Example:
    >>> job = submit_cell(Client(), "print(lr)", {"lr": 0.1}, nodes=2)  # doctest: +SKIP
    >>> wait_for_end(job)  # doctest: +SKIP
    job cell-3f2a (cell): SUCCEEDED
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from air_sdk.client.client import job_spec
from air_sdk.client.options import JobOptions, job_spec_fields
from air_sdk.errors import JobFailedError, SpecError
from air_sdk.notebook.job_views import job_status_text
from air_sdk.schema.state import JobState

if TYPE_CHECKING:
    from air_sdk.client import Client, Job
    from air_sdk.schema.api import JobRecord

__all__ = ["DEFAULT_JOB_NAME", "submit_cell", "wait_for_end"]

#: the job name when none is given
DEFAULT_JOB_NAME = "cell"


def submit_cell(
    client: Client,
    cell: str,
    namespace: Mapping[str, Any],
    *,
    files: Sequence[str] = (),
    max_value_bytes: int | None = None,
    **options: Unpack[JobOptions],
) -> Job:
    """Submit `cell` as a job that runs it on every rank; returns at once.

    What the cell uses from `namespace` travels with it (modules are imported again,
    functions, classes and values are pickled); `files` (relative to the working
    directory) and `options["workdir"]` (default: the working directory) are sent
    as its code. Bad options raise `SpecError` before anything is packaged; a value
    that cannot travel raises `CellCaptureError` before anything is uploaded.
    """
    from air_sdk.notebook.capture import DEFAULT_MAX_VALUE_BYTES, collect_files, package_cell

    if not cell.strip():
        raise SpecError("the cell is empty: write the training code below `%%air train`")
    if options.get("module"):
        raise SpecError(
            "module= names a program to run, and a cell is its own: leave it out"
            " (run a module with `air submit -m MODULE` or Client.submit_script(module=...))"
        )
    fields = job_spec_fields(options)
    fields.setdefault("name", DEFAULT_JOB_NAME)
    job_spec(code="pass", **fields)  # bad options fail before any packaging
    workdir = Path(options.get("workdir") or Path.cwd()).expanduser()
    if not workdir.is_dir():
        raise SpecError(f"--workdir {workdir}: not a directory")
    limit = DEFAULT_MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes
    package = package_cell(cell, namespace, max_value_bytes=limit)
    extra = collect_files(files, Path.cwd())
    clash = sorted(set(extra) & set(package.files))
    if clash:
        raise SpecError(f"--files: {clash[0]} is a name AIR uses for the cell; rename it")
    spec = job_spec(code=package.code, **fields)
    return client.submit(spec, workdir=workdir, extra_files={**extra, **package.files})


def wait_for_end(job: Job, *, show: Callable[[str], None] = print) -> JobRecord | None:
    """Block until `job` ends and show its final state; raise `JobFailedError` if it
    failed. Ctrl-C (interrupting the kernel) stops waiting, not the job: None then.
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
