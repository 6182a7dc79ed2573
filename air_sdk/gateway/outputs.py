"""`air outputs JOB`: list and download the files of a job's output directory.

    GET /v1/jobs/{id}/outputs               -> OutputList (path, bytes, mtime of each file)
    GET /v1/jobs/{id}/outputs/files/{path}  -> the file's bytes, streamed

A tenant reaches only its own jobs (another tenant's job is 404, as missing). The
gateway serves only the output directory it chose (`Runner.output_dir`): a job that
named its own `output_dir` is told to read it where it is, since that could name any
of the gateway's files. Inside the directory, `air_sdk.runner.outputs.OutputDir`
refuses paths with `..`, symlinks, and a directory swapped for a link, and opens each
file by fd, checked on that fd: what is served is what was checked, even while the
job swaps a file for a link as fast as it can.

A file is streamed in chunks, never held whole, and like every answer of the gateway
it carries no AIR token: `redacted_chunks` replaces each with `***` before a chunk
leaves, even one that straddles two reads (the redaction middleware only sees one
chunk at a time, and would hold a sized answer whole).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import quote

from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from air_sdk.errors import UnsafePathError
from air_sdk.gateway.app import ERROR_RESPONSES, CtxDep, PrincipalDep
from air_sdk.gateway.routes import _job_or_404
from air_sdk.redact import REDACTED, TOKEN_PATTERN_BYTES
from air_sdk.runner.outputs import OUTPUTS_DIR, OutputDir
from air_sdk.schema import JobRecord
from air_sdk.schema.outputs import OutputList

__all__ = ["redacted_chunks", "router"]

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)

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


def _served_dir(ctx: CtxDep, job: JobRecord) -> OutputDir:
    """The job's output directory, if this gateway may serve it (409 saying why not)."""
    if job.spec.output_dir:
        raise HTTPException(
            409,
            f"job {job.id} keeps its outputs in {job.spec.output_dir}, a place it named"
            " itself: the gateway serves only the directories it chose; read it there",
        )
    storage = ctx.runner.output_storage
    location = ctx.runner.output_dir(job.id)
    if "://" in location:
        raise HTTPException(
            409,
            f"job {job.id} keeps its outputs at {location}: read them with fsspec"
            " or the storage's own tools",
        )
    base = Path(storage) if storage else ctx.home / OUTPUTS_DIR
    try:
        return OutputDir.open(Path(location), base)
    except UnsafePathError as exc:
        raise HTTPException(409, str(exc)) from None


@router.get("/jobs/{job_id}/outputs", response_model=OutputList)
async def job_outputs(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> OutputList:
    job = _job_or_404(ctx, principal, job_id)
    with _served_dir(ctx, job) as root:
        files = await run_in_threadpool(root.files)  # a walk of many files blocks
    return OutputList(job_id=job.id, directory=str(root.path), files=files)


@router.get("/jobs/{job_id}/outputs/files/{path:path}", response_class=StreamingResponse)
def job_output_file(
    job_id: str, path: str, ctx: CtxDep, principal: PrincipalDep
) -> StreamingResponse:
    job = _job_or_404(ctx, principal, job_id)
    with _served_dir(ctx, job) as root:
        try:
            found = root.open_file(path)
        except UnsafePathError as exc:
            raise HTTPException(404, f"{exc}: list the files with `air outputs {job.id}`") from None
    # no Content-Length: the redaction may shorten the file, and the middleware would
    # hold a sized answer whole to measure it
    return StreamingResponse(
        redacted_chunks(found),
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(PurePosixPath(path).name)}"
        },
    )
