"""The worker report route without FastAPI's routing: every rank of a job posts to it
about twice a second, so what FastAPI does per request (matching ~60 routes, solving
dependencies, its exception middlewares) was a fifth of the gateway's time per report
(docs/benchmarks.md, "Ingest").

`ReportShortcut` is the innermost of the gateway's ASGI middlewares: a POST to
`/v1/jobs/{job_id}/attempts/{attempt}/report` has passed the same guards as any
request (token redaction, Host check, CORS, rate limit, body cap:
`air_sdk.gateway.security`) and then calls the route's own function,
`routes.worker_report`, whose worker-token, fencing and body checks are the only ones
this route ever had; an `AirError` it raises is answered as the translator answers it.
A path whose attempt is not a number goes on to FastAPI (its 422, as before).

Example:
    >>> app.add_middleware(ReportShortcut, endpoint=routes.worker_report)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from air_sdk.errors import AirError
from air_sdk.gateway.translate import detail_of, status_of

__all__ = ["ReportShortcut"]

_REPORT = re.compile(r"/v1/jobs/([^/]+)/attempts/([0-9]{1,18})/report")


class ReportShortcut:
    """POST .../report straight to `endpoint` (`routes.worker_report`); everything else
    to `app`."""

    def __init__(
        self, app: ASGIApp, endpoint: Callable[[str, int, Request], Awaitable[Response]]
    ) -> None:
        self.app = app
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _REPORT.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await self.endpoint(match[1], int(match[2]), Request(scope, receive))
        except AirError as exc:
            response = JSONResponse({"detail": detail_of(exc)}, status_code=status_of(exc))
        await response(scope, receive, send)
