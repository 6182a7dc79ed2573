"""The gateway's network guards: Host allow-list, CORS, body caps, rate limits, and
token redaction of every answer.

They are plain ASGI middlewares, installed by `install` around the whole app, so a
route added later is covered without a line of its own. From the outside in:

```
TokenRedactionMiddleware   no AIR token leaves in an answer (but POST /v1/admin/tokens)
HostCheckMiddleware        Host must be one this gateway serves: 400 (DNS rebinding)
CORSMiddleware             only when origins are configured; none by default
RateLimitMiddleware        token bucket per working token (users, workers), else per
                           client address (no token, or failed authentication): 429
BodySizeMiddleware         Content-Length / streamed bytes over the route's cap: 413
FastAPI app                auth (bearer -> Principal), roles, tenancy: 401/403/404
```

The options they read (`SecurityOptions`, `RequestLimits`, `RateLimit`) and the
bind rule live in `air_sdk.gateway.options`, which imports no server code.

Example:
    >>> app = create_app(ctx, security=SecurityOptions(cors_origins=("https://lab.example",)))  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from air_sdk.gateway.options import (
    KIB,
    MIB,
    REPORT_PATH,
    RateLimit,
    RequestLimits,
    SecurityOptions,
)
from air_sdk.redact import REDACTED, TOKEN_PATTERN_BYTES

__all__ = [
    "BodySizeMiddleware",
    "HostCheckMiddleware",
    "RateLimitMiddleware",
    "RateLimiter",
    "TokenRedactionMiddleware",
    "client_key",
    "install",
]

#: the one answer that must carry a token: issuing it
_TOKEN_ISSUE = ("POST", "/v1/admin/tokens")
_CORS_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID")


async def _send_json(
    send: Send, status: int, detail: str, headers: Sequence[tuple[str, str]] = ()
) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *[(k.lower().encode(), v.encode()) for k, v in headers],
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def _host_name(header: str) -> str | None:
    """The host part of a Host header ("[::1]:8470" -> "[::1]"), lower-case; None if bad."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        rest = header[end + 1 :] if end > 0 else None
        if rest is None or (rest and not (rest[:1] == ":" and rest[1:].isdigit())):
            return None
        return header[: end + 1]
    name, sep, port = header.partition(":")
    if not name or (sep and not port.isdigit()):
        return None
    return name


#: the answer to a request whose Host header does not name the gateway
HOST_REFUSAL = (
    "the Host header does not name this gateway (a defence against DNS rebinding):"
    " use its address, or start it with --allow-host NAME"
)


class HostCheckMiddleware:
    """400 unless the Host header names this gateway: a web page on another origin that
    re-points its DNS name at 127.0.0.1 (DNS rebinding) still sends its own name."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.exact = {h for h in allowed_hosts if not h.startswith("*")}
        self.suffixes = tuple(h[1:] for h in allowed_hosts if h.startswith("*."))
        self.any = "*" in allowed_hosts

    def allows(self, scope: Scope) -> bool:
        """Whether the request's Host header names this gateway."""
        if self.any:
            return True
        name = _host_name(_header(scope, b"host") or "")
        return name is not None and (name in self.exact or name.endswith(self.suffixes or ("\0",)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allows(scope):
            await self.app(scope, receive, send)
            return
        await _send_json(send, 400, HOST_REFUSAL)


class RateLimiter:
    """Token buckets by key. `acquire(key)` returns 0.0 when the request may go, else the
    seconds until it could.

    Example:
        >>> clock = iter([0.0, 0.0, 0.0]).__next__
        >>> limiter = RateLimiter(RateLimit(per_s=1, burst=2), clock=clock)
        >>> [limiter.acquire("t") for _ in range(3)]
        [0.0, 0.0, 1.0]
    """

    def __init__(
        self,
        limit: RateLimit,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[object, tuple[float, float]] = {}  # key -> (tokens, updated)

    def acquire(self, key: object) -> float:
        """Take one token if there is one: 0.0, else the seconds until there would be."""
        wait = self.check(key)
        if wait <= 0.0:
            self.charge(key)
        return wait

    def check(self, key: object) -> float:
        """The seconds until `key` has a token (0.0: now), taking none."""
        tokens = self._tokens(key, self._clock())
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.limit.per_s

    def charge(self, key: object) -> None:
        """Take one token, into debt if need be (down to -burst): for a cost found out
        after the request ran, such as a failed authentication."""
        # Called from the event loop thread only: no lock needed.
        now = self._clock()
        tokens = max(-float(self.limit.burst), self._tokens(key, now) - 1.0)
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self._max_keys:
            self._evict(now)

    def _tokens(self, key: object, now: float) -> float:
        burst = float(self.limit.burst)
        tokens, updated = self._buckets.get(key, (burst, now))
        return min(burst, tokens + (now - updated) * self.limit.per_s)

    def _evict(self, now: float) -> None:
        # A bucket that would be full again is the same as no bucket.
        refill_s = self.limit.burst / self.limit.per_s
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < refill_s}
        if len(self._buckets) > self._max_keys:  # a flood of fresh keys: keep the newest
            newest = sorted(self._buckets.items(), key=lambda kv: kv[1][1])[-self._max_keys // 2 :]
            self._buckets = dict(newest)


def client_key(scope: Scope) -> str:
    """The rate-limit key of a request's client: its address, an IPv6 one by its /64
    (one host usually holds a whole /64), as the server saw it. Forwarded headers
    count only when the server is told to trust the proxy that sets them (uvicorn's
    `forwarded_allow_ips`, `GatewayOptions.trusted_proxies`).

    Example:
        >>> client_key({"client": ("2001:db8::1", 5000)}), client_key({"client": ("10.0.0.7", 1)})
        ('2001:db8::/64', '10.0.0.7')
    """
    host = str((scope.get("client") or ("?",))[0])
    if ":" in host:
        try:
            return str(ipaddress.IPv6Network(f"{host}/64", strict=False))
        except ValueError:
            pass
    return host


class RateLimitMiddleware:
    """429 with Retry-After for a caller over its rate.

    A token that has been seen to work has a bucket of its own (worker reports a
    separate, higher rate). Everything else counts against its client's address:
    requests without a token when they arrive, and requests with a token nobody has
    vouched for when they fail authentication (401). So a fresh random token per
    request (the issue-14 probe) buys nothing: its 401s drain the address's bucket,
    and past it each one is refused after one indexed lookup (`token_exists`), before
    any route runs. A new real token costs its address nothing and is let through
    even while its neighbours are refused."""

    def __init__(
        self,
        app: ASGIApp,
        limits: RequestLimits,
        *,
        token_exists: Callable[[str], bool] | None = None,
        max_known_tokens: int = 10_000,
    ) -> None:
        self.app = app
        self._token_exists = token_exists
        self.users = RateLimiter(limits.user_rate) if limits.user_rate else None
        self.workers = RateLimiter(limits.worker_rate) if limits.worker_rate else None
        self.anonymous = RateLimiter(limits.anonymous_rate) if limits.anonymous_rate else None
        #: digests of tokens answered with something other than 401, most recent last
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._max_known = max_known_tokens

    def admit(self, scope: Scope) -> Admission:
        """This request's verdict, its token taken from its bucket when it may go."""
        auth = _header(scope, b"authorization") or ""
        scheme, _, token = auth.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        address = client_key(scope)
        if not token:
            wait = self.anonymous.acquire(address) if self.anonymous else 0.0
            if wait > 0.0:
                return self._refusal(wait, "client address", self.anonymous)
            return Admission()
        digest = hashlib.sha256(token.encode()).digest()
        known = digest in self._known
        if known:
            self._known.move_to_end(digest)
        elif self.anonymous is not None:
            # A token not seen to work yet: its address must have room for one more failure.
            wait = self.anonymous.check(address)
            if wait > 0.0 and not (self._token_exists and self._token_exists(token)):
                return self._refusal(
                    wait, "client address (failed authentications)", self.anonymous
                )
        is_report = scope["method"] == "POST" and REPORT_PATH.fullmatch(scope["path"])
        limiter = self.workers if is_report else self.users
        wait = limiter.acquire(digest) if limiter else 0.0
        if wait > 0.0:
            return self._refusal(wait, "token", limiter)
        return Admission(digest=digest, address=None if known else address)

    def learn(self, admission: Admission, status: int) -> None:
        """What an admitted request's answer tells: a 401 charges its address (when the
        token was not known) and forgets the token, any other answer vouches for it."""
        digest = admission.digest
        if digest is None:
            return
        if status == 401:
            self._known.pop(digest, None)
            if admission.address is not None and self.anonymous is not None:
                self.anonymous.charge(admission.address)
        else:
            self._known[digest] = None
            if len(self._known) > self._max_known:
                self._known.popitem(last=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        admission = self.admit(scope)
        if admission.refusal is not None:
            await admission.refusal.send(send)
            return
        if admission.digest is None:
            await self.app(scope, receive, send)
            return

        async def watching_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.learn(admission, message["status"])
            await send(message)

        await self.app(scope, receive, watching_send)

    @staticmethod
    def _refusal(wait: float, who: str, limiter: RateLimiter | None) -> Admission:
        assert limiter is not None
        retry_after = max(1, math.ceil(wait))
        return Admission(
            refusal=Refusal(
                429,
                f"too many requests from this {who}: at most {limiter.limit.per_s:g}/s in"
                f" bursts of {limiter.limit.burst}; retry after {retry_after} s",
                (("Retry-After", str(retry_after)),),
            )
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer a guard gives instead of the route."""

    status: int
    detail: str
    headers: tuple[tuple[str, str], ...] = ()

    async def send(self, send: Send) -> None:
        await _send_json(send, self.status, self.detail, self.headers)


@dataclass(frozen=True, slots=True)
class Admission:
    """`RateLimitMiddleware.admit`'s verdict: a `refusal`, or leave to go on; `digest`
    (the token's) and `address` (its client's, while the token is not known to work)
    are what `learn` needs once the answer's status is known."""

    refusal: Refusal | None = None
    digest: bytes | None = None
    address: str | None = None


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes its cap (an HTTPException, so
    FastAPI's body parsing passes it on and its handler answers 413 with the detail)."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class BodySizeMiddleware:
    """413 for a body over its route's cap: at once from Content-Length, or as soon as
    the streamed bytes pass it (chunked uploads)."""

    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    def check(self, scope: Scope) -> tuple[int, str, Refusal | None]:
        """(the route's cap, the 413's detail, a refusal from Content-Length or None)."""
        cap, advice = self.limits.body_cap(scope["method"], scope["path"])
        detail = f"the request body is over {_size(cap)}, the limit for this route: {advice}"
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                return cap, detail, Refusal(400, "Content-Length is not a number")
            if int(length) > cap:
                return cap, detail, Refusal(413, detail)
        return cap, detail, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap, detail, refusal = self.check(scope)
        if refusal is not None:
            await refusal.send(send)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise BodyTooLarge(detail)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if started:
                raise
            await _send_json(send, 413, detail)


def _size(num_bytes: int) -> str:
    if num_bytes >= MIB:
        return f"{num_bytes / MIB:g} MiB"
    if num_bytes >= KIB and num_bytes % KIB == 0:
        return f"{num_bytes // KIB} KiB"
    return f"{num_bytes} bytes"


class TokenRedactionMiddleware:
    """Replaces every AIR token in every answer body with REDACTED: a token a job
    printed, passed as an arg or set in a non-secret env var never leaves the gateway.
    The one exception is the answer that issues a token."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._redacted = REDACTED.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] == "HEAD"
            or (scope["method"], scope["path"].rstrip("/")) == _TOKEN_ISSUE
        ):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        buffered: list[bytes] = []

        async def redacting_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if any(k.lower() == b"content-length" for k, _ in message.get("headers", ())):
                    start = message  # a sized body: hold the head until the length is known
                    return
                await send(message)  # a stream (SSE): redact chunk by chunk
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            if start is None:
                body = TOKEN_PATTERN_BYTES.sub(self._redacted, message.get("body", b""))
                await send({**message, "body": body})
                return
            buffered.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            whole = TOKEN_PATTERN_BYTES.sub(self._redacted, b"".join(buffered))
            headers = [
                (k, str(len(whole)).encode() if k.lower() == b"content-length" else v)
                for k, v in start.get("headers", ())
            ]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": whole})

        await self.app(scope, receive, redacting_send)


def install(
    app: Any, options: SecurityOptions, token_exists: Callable[[str], bool] | None = None
) -> None:
    """Wrap `app` (a FastAPI/Starlette app) in the guards, outermost last. `token_exists`
    (the store's) lets a real token through while its address is refused."""
    app.add_middleware(BodySizeMiddleware, limits=options.limits)
    app.add_middleware(RateLimitMiddleware, limits=options.limits, token_exists=token_exists)
    if options.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.cors_origins),
            allow_methods=["GET", "HEAD", "POST", "PUT"],
            allow_headers=list(_CORS_HEADERS),
            allow_credentials=False,  # bearer tokens, never cookies
        )
    app.add_middleware(HostCheckMiddleware, allowed_hosts=options.all_hosts())
    app.add_middleware(TokenRedactionMiddleware)
