"""The worker report route in front of the middleware stack: every rank of a job posts
to it about twice a second, so what each request paid to cross the stack (eight ASGI
layers, each a coroutine and most a wrapped `send`, then FastAPI's routing and
dependencies) was a large part of the gateway's time per report (docs/benchmarks.md,
"Ingest").

`ReportShortcut` is the outermost layer. A POST to
`/v1/jobs/{job_id}/attempts/{attempt}/report` is answered here after the same guards,
called on the very instances the stack holds (`air_sdk.gateway.security`), so their
state (token buckets, tokens known to work) is one:

- the Host allow-list (`HostCheckMiddleware.allows`): 400;
- the rate limit (`RateLimitMiddleware.admit` / `learn`): 429, failures charged;
- the body cap (`BodySizeMiddleware.check`), from Content-Length and as the bytes
  arrive: 413;
- token redaction of the answer (`TokenRedactionMiddleware`'s pattern);
- an unexpected error: a 500, raised on to the server, which logs it (as Starlette's
  `ServerErrorMiddleware`).

Then the route's own checks and the ingest (`routes.ingest_worker_report`); an
`AirError` is answered as the translator answers it. A path whose attempt is not a
number goes on to FastAPI (its 422), and when CORS origins are configured there is no
shortcut at all (the stack's CORS layer answers browsers; workers are not browsers).

Example:
    >>> app = ReportShortcut.around(stack, endpoint=routes.ingest_worker_report)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from air_sdk.errors import AirError
from air_sdk.gateway.security import (
    HOST_REFUSAL,
    BodySizeMiddleware,
    HostCheckMiddleware,
    RateLimitMiddleware,
    TokenRedactionMiddleware,
)
from air_sdk.gateway.translate import detail_of, status_of
from air_sdk.redact import REDACTED, TOKEN_PATTERN_BYTES

__all__ = ["ReportShortcut"]

_REPORT = re.compile(r"/v1/jobs/([^/]+)/attempts/([0-9]{1,18})/report")

#: (scope, job id, attempt, bearer token or None, body, Content-Type) -> stored
Endpoint = Callable[[Scope, str, int, "str | None", bytes, "str | None"], Awaitable[None]]


class ReportShortcut:
    """POST .../report answered here after the stack's guards; everything else to
    `app`, the whole stack."""

    def __init__(
        self,
        app: ASGIApp,
        endpoint: Endpoint,
        *,
        host: HostCheckMiddleware,
        rate: RateLimitMiddleware,
        body: BodySizeMiddleware,
    ) -> None:
        self.app = app
        self.endpoint = endpoint
        self.host = host
        self.rate = rate
        self.body = body
        self._redacted = REDACTED.encode()

    @classmethod
    def around(cls, stack: ASGIApp, endpoint: Endpoint) -> ASGIApp:
        """`stack` with the shortcut in front, using the guards it holds; `stack` itself
        when it lacks one of them or answers CORS (then reports take the long way)."""
        found: dict[type, Any] = {}
        layer: Any = stack
        while layer is not None:
            found.setdefault(type(layer), layer)
            layer = getattr(layer, "app", None)
        guards = (HostCheckMiddleware, RateLimitMiddleware, BodySizeMiddleware)
        if CORSMiddleware in found or TokenRedactionMiddleware not in found:
            return stack
        if any(guard not in found for guard in guards):
            return stack
        return cls(
            stack,
            endpoint,
            host=found[HostCheckMiddleware],
            rate=found[RateLimitMiddleware],
            body=found[BodySizeMiddleware],
        )

    @staticmethod
    def match(scope: Scope) -> re.Match[str] | None:
        """The report route's match of `scope` (job id, attempt), or None."""
        if scope["type"] == "http" and scope["method"] == "POST":
            return _REPORT.fullmatch(scope["path"])
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = self.match(scope)
        if match is None:
            await self.app(scope, receive, send)
            return
        await self.answer(match, scope, receive, send)

    async def answer(
        self, match: re.Match[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Answer a report request (`match` from `match(scope)`)."""
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self._report(match[1], int(match[2]), scope, receive, watched_send)
        except Exception:
            if not started:
                await self._send(send, 500, "Internal Server Error")
            raise

    async def _report(
        self, job_id: str, attempt: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if not self.host.allows(scope):
            await self._send(send, 400, HOST_REFUSAL)
            return
        admission = self.rate.admit(scope)
        if admission.refusal is not None:
            await admission.refusal.send(send)
            return
        status, detail = await self._ingest(job_id, attempt, scope, receive)
        if status is None:  # the client went away before its body arrived
            return
        self.rate.learn(admission, status)
        await self._send(send, status, detail)

    async def _ingest(
        self, job_id: str, attempt: int, scope: Scope, receive: Receive
    ) -> tuple[int | None, str]:
        cap, too_large, refusal = self.body.check(scope)
        if refusal is not None:
            return refusal.status, refusal.detail
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, ""
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > cap:
                return 413, too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        headers: dict[bytes, bytes] = {}
        for key, value in scope["headers"]:  # the first of each, as Starlette reads them
            headers.setdefault(key.lower(), value)
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        content_type = headers.get(b"content-type")
        try:
            await self.endpoint(
                scope,
                job_id,
                attempt,
                bearer,
                b"".join(chunks),
                content_type.decode("latin-1") if content_type is not None else None,
            )
        except AirError as exc:
            return status_of(exc), detail_of(exc)
        return 204, ""

    async def _send(self, send: Send, status: int, detail: str) -> None:
        if status == 204:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = TOKEN_PATTERN_BYTES.sub(self._redacted, json.dumps({"detail": detail}).encode())
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
