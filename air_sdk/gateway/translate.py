"""The one translator from AIR's exceptions to HTTP answers (as httpx maps transport
errors in one place): a service raises an `AirError`; the answer is its status and
`{"detail": message}` (`ErrorBody`).

    ApiError (and subclasses)   its own `status` (NotFoundError 404, ConflictError 409, ...)
    BundleTooLargeError         413
    BundleError, SpecError,
    ConfigError, other AirError 400

Example:
    >>> from air_sdk.errors import BundleTooLargeError, NotFoundError
    >>> status_of(NotFoundError(404, "no job x")), status_of(BundleTooLargeError("big"))
    (404, 413)
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from air_sdk.errors import AirError, ApiError, BundleTooLargeError

__all__ = ["detail_of", "install_translator", "status_of"]


def status_of(exc: AirError) -> int:
    """The HTTP status that answers `exc`."""
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(exc, BundleTooLargeError):
        return 413
    return 400


def detail_of(exc: AirError) -> str:
    """The answer's `detail`: the message, without the client's "(HTTP n)" suffix."""
    return exc.message if isinstance(exc, ApiError) else str(exc)


def install_translator(app: FastAPI) -> None:
    """Answer every `AirError` a route or service raises with `status_of` and its detail."""

    @app.exception_handler(AirError)
    async def _air_error(request: Request, exc: AirError) -> JSONResponse:
        return JSONResponse({"detail": detail_of(exc)}, status_code=status_of(exc))
