"""The gateway's FastAPI application: auth, error shape, and the pieces routes share.

Routes are thin: HTTP in, one call to the store or runner, HTTP out. Decisions
live in `air_sdk.scheduler` and `air_sdk.runner`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

import air_sdk
from air_sdk.runner import Runner
from air_sdk.store import SqliteStore


@dataclass
class GatewayContext:
    """What every route can reach: the store, the runner and where files go."""

    store: SqliteStore
    runner: Runner
    home: Path

    @property
    def bundles_dir(self) -> Path:
        return self.home / "bundles"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant and a role (admin | member | viewer)."""

    tenant: str
    role: str


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
    return Principal(*found)


CtxDep = Annotated[GatewayContext, Depends(get_ctx)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]


def create_app(ctx: GatewayContext, *, start_runner: bool = True) -> FastAPI:
    """The gateway app over `ctx`; the runner starts and stops with the app.

    Example:
        >>> app = create_app(GatewayContext(store, runner, home))  # doctest: +SKIP
    """
    from air_sdk.gateway import routes

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if start_runner:
            ctx.runner.start()
        try:
            yield
        finally:
            if start_runner:
                ctx.runner.stop()

    app = FastAPI(
        title="AIR gateway",
        version=air_sdk.__version__,
        lifespan=lifespan,
        openapi_url=None,  # served under /v1 behind auth instead
        docs_url=None,
        redoc_url=None,
    )
    app.state.air = ctx

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # One readable line per problem, naming the field, e.g. "resources.nodes: ..."
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
            lines.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else err.get("msg", ""))
        return JSONResponse({"detail": "; ".join(lines) or "invalid request"}, status_code=422)

    app.include_router(routes.router)
    app.include_router(routes.worker_router)

    @app.get("/v1/openapi.json", include_in_schema=False)
    def openapi(_: PrincipalDep) -> JSONResponse:
        return JSONResponse(app.openapi())

    return app
