"""`/ui`: a web page for everyone outside a notebook (operators, CI, a terminal user who
wants a chart): the jobs list, and a job page with live state, chart, utilization,
checkpoints, each rank's log tail and a cancel button.

The page itself (`/ui`, `/ui/app.js`, `/ui/app.css`) holds no data and needs no token:
it asks for one, keeps it in the tab's `sessionStorage` and sends it as a bearer
header; a token never goes into a URL. Its data comes from the API like any client's:
`GET /v1/jobs`, `POST /v1/jobs/{id}/cancel`, the event stream
`GET /v1/jobs/{id}/events/stream` (read with `fetch`, which can send the header,
unlike `EventSource`) and `GET /v1/ui/jobs/{id}`: the job's monitor as HTML, drawn on
the gateway by the notebook monitor's own renderer. No CDN, no external request: it
works offline. A strict Content-Security-Policy allows only the gateway's own script
and style, and images from `data:` URLs (the chart).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel

from air_sdk.gateway.app import CtxDep, PrincipalDep
from air_sdk.gateway.routes import ERROR_RESPONSES, _job_or_404
from air_sdk.gateway.services.ui import UiRenderer

router = APIRouter()
api_router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


class UiJobPage(BaseModel):
    """`GET /v1/ui/jobs/{job_id}`: the job's monitor as HTML and what the page's
    controls need."""

    job_id: str
    state: str
    terminal: bool
    last_seq: int
    html: str
    #: a viewer token only reads; an ended job has nothing to cancel
    can_cancel: bool


#: what the page may load: its own script and style, the chart as a data: URL
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'"
    " data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript",
    "app.css": "text/css",
}


def _static(name: str) -> Response:
    body = resources.files("air_sdk.gateway").joinpath("ui_static", name).read_bytes()
    headers = {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-cache",
        "Referrer-Policy": "no-referrer",
    }
    return Response(body, media_type=_TYPES[name], headers=headers)


@router.get("/ui", include_in_schema=False)
def ui_page() -> Response:
    return _static("index.html")


@router.get("/ui/app.js", include_in_schema=False)
def ui_script() -> Response:
    return _static("app.js")


@router.get("/ui/app.css", include_in_schema=False)
def ui_style() -> Response:
    return _static("app.css")


@api_router.get("/ui/jobs/{job_id}", response_model=UiJobPage)
async def ui_job(job_id: str, request: Request, ctx: CtxDep, principal: PrincipalDep) -> UiJobPage:
    """The job's monitor as HTML (the notebook's renderer), its state, and whether this
    caller may cancel it (viewer tokens only read)."""
    job = _job_or_404(ctx, principal, job_id)
    ui: UiRenderer = request.app.state.ui
    page = await run_in_threadpool(ui.page, job)
    return UiJobPage(
        job_id=page.job_id,
        state=page.state,
        terminal=page.terminal,
        last_seq=page.last_seq,
        html=page.html,
        can_cancel=principal.role != "viewer" and not page.terminal,
    )
