"""`air outputs JOB`: list and download the files of a job's output directory.

    GET /v1/jobs/{id}/outputs               -> OutputList (path, bytes, mtime of each file)
    GET /v1/jobs/{id}/outputs/files/{path}  -> the file's bytes, streamed

A tenant reaches only its own jobs (another tenant's job is 404, as missing). What
may be served, and how a file is opened and redacted, is
`air_sdk.gateway.services.outputs`; these routes only translate.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import quote

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from air_sdk.gateway.app import ERROR_RESPONSES, CtxDep, PrincipalDep
from air_sdk.gateway.routes import _job_or_404
from air_sdk.gateway.services.outputs import job_output_list, open_job_output, redacted_chunks
from air_sdk.schema.outputs import OutputList

__all__ = ["redacted_chunks", "router"]

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


@router.get("/jobs/{job_id}/outputs", response_model=OutputList)
async def job_outputs(job_id: str, ctx: CtxDep, principal: PrincipalDep) -> OutputList:
    job = _job_or_404(ctx, principal, job_id)
    return await run_in_threadpool(job_output_list, ctx, job)


@router.get("/jobs/{job_id}/outputs/files/{path:path}", response_class=StreamingResponse)
def job_output_file(
    job_id: str, path: str, ctx: CtxDep, principal: PrincipalDep
) -> StreamingResponse:
    job = _job_or_404(ctx, principal, job_id)
    found = open_job_output(ctx, job, path)
    # no Content-Length: the redaction may shorten the file, and the middleware would
    # hold a sized answer whole to measure it
    name = quote(PurePosixPath(path).name)
    return StreamingResponse(
        redacted_chunks(found),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{name}"},
    )
