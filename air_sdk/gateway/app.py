"""The gateway's FastAPI application: auth, error shape, and the pieces routes share.

Routes are thin: HTTP in, one call to the store, runner or a service
(`air_sdk.gateway.services`), HTTP out. Decisions live in `air_sdk.scheduler`,
`air_sdk.runner` and the services; an `AirError` becomes an answer in one place
(`air_sdk.gateway.translate`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

import air_sdk
from air_sdk.export.service import ExportService
from air_sdk.gateway.bodies import add_body_schemas, describe_errors
from air_sdk.gateway.metrics import GatewayMetrics
from air_sdk.gateway.options import SecurityOptions
from air_sdk.gateway.report_shortcut import ReportShortcut
from air_sdk.gateway.security import install
from air_sdk.gateway.services.report_writer import ReportWriter
from air_sdk.gateway.translate import install_translator
from air_sdk.runner import Runner
from air_sdk.schema import ErrorBody
from air_sdk.store import DEFAULT_TENANT, SqliteStore

#: methods a viewer token may use: reading never changes anything
READ_METHODS = frozenset({"GET", "HEAD"})

_ERROR_SCHEMA = ErrorBody.model_json_schema()
#: every error answer is an ErrorBody; declared on every router so the OpenAPI schema
#: (and clients generated from it) know the shape of a 401, a 404 or a 429
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    # The schema inline, not as a "model": FastAPI would file it under a streaming
    # route's media type (text/event-stream), but errors are always JSON.
    code: {"description": text, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for code, text in [
        (400, "Bad request: the detail says what to change"),
        (401, "No token, or not a valid one"),
        (403, "The token's role may not do this"),
        (404, "No such resource in your tenant"),
        (409, "Conflict: exists already, or a fenced-off attempt"),
        (413, "The body is over this route's cap"),
        (422, "The body or a parameter is invalid"),
        (429, "Over the rate limit: see Retry-After"),
    ]
}


@dataclass
class GatewayContext:
    """What every route can reach: the store, the runner and where files go."""

    store: SqliteStore
    runner: Runner
    home: Path
    #: why no tenant but the default may be made (an unsandboxed local backend), or None
    tenant_refusal: str | None = None
    #: forwards exporting jobs' events to trackers (None: this gateway exports nothing)
    exports: ExportService | None = None
    #: Prometheus instruments (`air_sdk.gateway.metrics`); made by `create_app`
    metrics: GatewayMetrics | None = None
    #: /metrics answers a loopback peer without a token (`air_sdk.gateway.scrape`)
    metrics_from_loopback: bool = False
    #: ingests worker reports in group commits (`air_sdk.gateway.services.report_writer`);
    #: made by `create_app`
    reports: ReportWriter | None = None

    @property
    def bundles_dir(self) -> Path:
        return self.home / "bundles"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant and a role (admin | member | viewer | metrics).

    Example:
        >>> Principal("default", "admin").is_system_admin
        True
    """

    tenant: str
    role: str

    @property
    def is_system_admin(self) -> bool:
        """An admin of the system tenant: manages every tenant, its tokens and the nodes."""
        return self.role == "admin" and self.tenant == DEFAULT_TENANT


def get_ctx(request: Request) -> GatewayContext:
    ctx: GatewayContext = request.app.state.air
    return ctx


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def get_principal(request: Request, ctx: Annotated[GatewayContext, Depends(get_ctx)]) -> Principal:
    token = bearer_token(request)
    if token is None:
        raise _unauthorized(
            "missing bearer token: set AIR_TOKEN or the token in ~/.config/air/config.toml"
        )
    found = ctx.store.lookup_token(token)
    if found is None:
        raise _unauthorized("the token is not valid (revoked, or for another gateway)")
    principal = Principal(*found)
    if principal.role == "metrics":  # the scraper's token: /metrics checks it itself
        raise HTTPException(403, "a metrics token reads /metrics only: use a member token")
    # One rule for every route, present and future: a viewer only reads.
    if principal.role == "viewer" and request.method not in READ_METHODS:
        raise HTTPException(
            403, "a viewer token is read-only: ask an admin of your tenant for a member token"
        )
    return principal


def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if principal.role != "admin":
        raise HTTPException(403, f"this needs an admin token; yours is a {principal.role} token")
    return principal


def require_system_admin(principal: Annotated[Principal, Depends(require_admin)]) -> Principal:
    if not principal.is_system_admin:
        raise HTTPException(
            403,
            f"this needs an admin token of the system tenant {DEFAULT_TENANT!r};"
            f" yours manages tenant {principal.tenant!r} only",
        )
    return principal


CtxDep = Annotated[GatewayContext, Depends(get_ctx)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
AdminDep = Annotated[Principal, Depends(require_admin)]
SystemAdminDep = Annotated[Principal, Depends(require_system_admin)]


class GatewayApp(FastAPI):
    """FastAPI with the worker report route in front of its middleware stack
    (`air_sdk.gateway.report_shortcut`): the same guards, called directly. Once the
    stack is built, a report goes to the shortcut straight from here, past FastAPI's and
    Starlette's own entry (FastAPI looks up its OpenTelemetry providers on every
    request: reports are not traced)."""

    def build_middleware_stack(self) -> ASGIApp:
        from air_sdk.gateway.routes import ingest_worker_report

        return ReportShortcut.around(super().build_middleware_stack(), ingest_worker_report)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shortcut = self.middleware_stack
        if type(shortcut) is ReportShortcut and not self.root_path:
            match = shortcut.match(scope)
            if match is not None:
                scope["app"] = self  # as Starlette sets it
                await shortcut.answer(match, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    ctx: GatewayContext, *, start_runner: bool = True, security: SecurityOptions | None = None
) -> GatewayApp:
    """The gateway app over `ctx`; the runner starts and stops with the app.

    `security` sets the Host allow-list, CORS origins, body caps and rate limits
    (default: loopback names only, no CORS, the caps of `RequestLimits`).

    Example:
        >>> app = create_app(GatewayContext(store, runner, home))  # doctest: +SKIP
    """
    from air_sdk.gateway import admin, maintenance, outputs, routes, scrape, ui
    from air_sdk.gateway.services.ui import UiRenderer
    from air_sdk.gateway.streams import OpenStreams

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # reports commit on the loop: their commits must not stall on a WAL checkpoint
        stop_checkpoints = ctx.store.checkpoint_in_background()
        if start_runner:
            ctx.runner.start()
            if ctx.exports is not None:
                ctx.exports.start()
        try:
            yield
        finally:
            if ctx.reports is not None:
                ctx.reports.stop()
            stop_checkpoints()
            if start_runner:
                if ctx.exports is not None:
                    ctx.exports.stop()
                ctx.runner.stop()

    app = GatewayApp(
        title="AIR gateway",
        version=air_sdk.__version__,
        lifespan=lifespan,
        openapi_url=None,  # served under /v1 behind auth instead
        docs_url=None,
        redoc_url=None,
    )
    app.state.air = ctx
    if ctx.metrics is None:
        ctx.metrics = GatewayMetrics()
        ctx.metrics.attach(ctx)
    if ctx.reports is None:
        ctx.reports = ReportWriter(ctx)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # One readable line per problem, naming the field, e.g. "resources.nodes: ...";
        # a bounded number of them, and never the input (see air_sdk.gateway.bodies).
        return JSONResponse({"detail": describe_errors(exc.errors())}, status_code=422)

    install_translator(app)
    app.include_router(routes.router)
    app.include_router(routes.worker_router)
    app.include_router(admin.router)
    app.include_router(maintenance.router)
    app.include_router(outputs.router)
    app.include_router(ui.router)
    app.include_router(ui.api_router)
    app.state.ui = UiRenderer(ctx.store)
    app.include_router(scrape.router)
    install(app, security or SecurityOptions(), token_exists=ctx.store.token_exists)
    app.state.streams = OpenStreams.from_limits((security or SecurityOptions()).limits)

    @app.get("/v1/openapi.json", include_in_schema=False)
    def openapi(_: PrincipalDep) -> JSONResponse:
        if app.openapi_schema is None:
            # Bodies that routes read themselves (`json_body`) need their schemas added.
            app.openapi_schema = add_body_schemas(app.openapi())
        return JSONResponse(app.openapi_schema)

    return app
