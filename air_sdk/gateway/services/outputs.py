"""Serving a job's output directory: which directory may be served, its listing, and
its files, read from the fd that was checked (`air_sdk.runner.outputs.OutputDir`) with
every AIR token redacted.

The gateway serves only the output directory it chose (`Runner.output_dir`): a job
that named its own `output_dir` is told to read it where it is, since that could name
any of the gateway's files. Inside the directory, paths with `..`, symlinks, and a
directory swapped for a link are refused, and each file is opened by fd, checked on
that fd: what is served is what was checked, even while the job swaps a file for a
link as fast as it can.

A file is streamed in chunks, never held whole, and like every answer of the gateway
it carries no AIR token: `redacted_chunks` replaces each with `***` before a chunk
leaves, even one that straddles two reads (the redaction middleware only sees one
chunk at a time, and would hold a sized answer whole).

Example:
    >>> listing = job_output_list(ctx, job)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from air_sdk.errors import ConflictError, NotFoundError, UnsafePathError
from air_sdk.redact import REDACTED, TOKEN_PATTERN_BYTES
from air_sdk.runner.outputs import OUTPUTS_DIR, OutputDir
from air_sdk.schema import JobRecord
from air_sdk.schema.outputs import OutputList

if TYPE_CHECKING:
    from air_sdk.gateway.app import GatewayContext

__all__ = ["CHUNK_BYTES", "job_output_list", "open_job_output", "redacted_chunks", "served_dir"]

#: bytes read from a file at a time
CHUNK_BYTES = 1 << 20
#: the longest AIR token less one byte: what may be the start of a token cut by a read
_TOKEN_TAIL = len("airw_") + 43 - 1


def redacted_chunks(src: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The bytes of the open file `src` in chunks of about `chunk_bytes`, every AIR token
    replaced by `***`, including one split across two reads (the last bytes of a read
    wait for the next one: a token not whole in this read starts within them); `src`
    is closed at the end.

    Example:
        >>> import io
        >>> b"".join(redacted_chunks(io.BytesIO(b"token air_" + b"x" * 43 + b" end"), 8))
        b'token *** end'
    """
    redacted = REDACTED.encode()
    carry = b""
    with src:
        while block := src.read(chunk_bytes):
            data = TOKEN_PATTERN_BYTES.sub(redacted, carry + block)
            cut = max(len(data) - _TOKEN_TAIL, 0)
            carry = data[cut:]
            if cut:
                yield data[:cut]
    if carry:
        yield TOKEN_PATTERN_BYTES.sub(redacted, carry)


def served_dir(ctx: GatewayContext, job: JobRecord) -> OutputDir:
    """The job's output directory, opened, if this gateway may serve it (the caller
    closes it); a `ConflictError` (409) saying why not."""
    if job.spec.output_dir:
        raise ConflictError(
            409,
            f"job {job.id} keeps its outputs in {job.spec.output_dir}, a place it named"
            " itself: the gateway serves only the directories it chose; read it there",
        )
    storage = ctx.runner.output_storage
    location = ctx.runner.output_dir(job.id)
    if "://" in location:
        raise ConflictError(
            409,
            f"job {job.id} keeps its outputs at {location}: read them with fsspec"
            " or the storage's own tools",
        )
    base = Path(storage) if storage else ctx.home / OUTPUTS_DIR
    try:
        return OutputDir.open(Path(location), base)
    except UnsafePathError as exc:
        raise ConflictError(409, str(exc)) from None


def job_output_list(ctx: GatewayContext, job: JobRecord) -> OutputList:
    """The regular files of the job's output directory (blocking: a walk of many files)."""
    with served_dir(ctx, job) as root:
        return OutputList(job_id=job.id, directory=str(root.path), files=root.files())


def open_job_output(ctx: GatewayContext, job: JobRecord, path: str) -> BinaryIO:
    """The file `path` of the job's output directory, open for reading (the caller
    closes it); a `NotFoundError` (404) saying why not for anything but a regular file
    inside it."""
    with served_dir(ctx, job) as root:
        try:
            return root.open_file(path)
        except UnsafePathError as exc:
            raise NotFoundError(404, f"{exc}: list the files with `air outputs {job.id}`") from None
