"""`air outputs JOB`: list and download the files of a job's output directory.

    GET /v1/jobs/{id}/outputs               -> OutputList (path, bytes, mtime of each file)
    GET /v1/jobs/{id}/outputs/files/{path}  -> the file's bytes, streamed

A tenant reaches only its own jobs (another tenant's job is 404, as missing). The
gateway serves only the output directory it chose (`Runner.output_dir`): a job that
named its own `output_dir` is told to read it where it is, since that could name any
of the gateway's files. Inside the directory, `air_sdk.runner.outputs` refuses paths
with `..`, symlinks, and a directory swapped for a link.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from air_sdk.errors import ConfigError
from air_sdk.gateway.app import ERROR_RESPONSES, CtxDep, PrincipalDep
from air_sdk.gateway.routes import _job_or_404
from air_sdk.runner.outputs import OUTPUTS_DIR, checked_root, list_outputs, output_file
from air_sdk.schema import JobRecord
from air_sdk.schema.outputs import OutputList

__all__ = ["router"]

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


def _served_dir(ctx: CtxDep, job: JobRecord) -> Path:
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
        return checked_root(Path(location), base)
    except ConfigError as exc:
        raise HTTPException(409, str(exc)) from None


@router.get("/jobs/{job_id}/outputs", response_model=OutputList)
async def job_outputs(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> OutputList:
    job = _job_or_404(ctx, principal, job_id)
    root = _served_dir(ctx, job)
    files = await run_in_threadpool(list_outputs, root)  # a walk of many files blocks
    return OutputList(job_id=job.id, directory=str(root), files=files)


@router.get("/jobs/{job_id}/outputs/files/{path:path}", response_class=FileResponse)
def job_output_file(job_id: str, path: str, ctx: CtxDep, principal: PrincipalDep) -> FileResponse:
    job = _job_or_404(ctx, principal, job_id)
    root = _served_dir(ctx, job)
    try:
        found = output_file(root, path)
    except ConfigError as exc:
        raise HTTPException(404, f"{exc}: list the files with `air outputs {job.id}`") from None
    # FileResponse streams the file in chunks; the name in a download is the last part
    return FileResponse(found, media_type="application/octet-stream", filename=found.name)
