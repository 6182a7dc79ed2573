"""The client's only I/O seam: one `requests.Session`, retries and error translation.

Everything the gateway answers passes through `HttpTransport.request`, so this is
the one place where HTTP statuses and `requests` exceptions become the classes
of `air_sdk.errors`:

| wire                                   | raised                                   |
|----------------------------------------|------------------------------------------|
| connection refused                     | `TransportError` (at once: nothing listens) |
| connection reset / timeout             | `TransportError` (after `max_attempts`)  |
| 401                                    | `AuthError`                              |
| 404                                    | `NotFoundError`                          |
| 409                                    | `ConflictError`                          |
| 422 whose detail names Idempotency-Key | `IdempotencyError`                       |
| 429                                    | `RateLimitedError` (after `max_attempts`)|
| 502 / 503 / 504                        | `ApiError` (after `max_attempts`)        |
| any other >= 400                       | `ApiError`                               |

Tests swap the network for `MockAdapter(handler)` mounted on the session (the
httpx `MockTransport` idea; `mock_session` does the mounting) and monkeypatch
`_sleep` so retries do not really wait.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from pydantic import BaseModel, ValidationError
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
)

from air_sdk.config import config_file
from air_sdk.errors import (
    ApiError,
    AuthError,
    ConflictError,
    IdempotencyError,
    NotFoundError,
    RateLimitedError,
    TransportError,
)

__all__ = [
    "DROPPED",
    "FailureRun",
    "HttpTransport",
    "MockAdapter",
    "error_for_response",
    "is_refused",
    "mock_response",
    "mock_session",
    "parse_model",
    "render_detail",
    "retrying",
]

#: statuses that say "try again later" rather than "your request is wrong"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: a Retry-After larger than this is capped: a CLI user should not hang for an hour
MAX_RETRY_AFTER_S = 60.0
#: jittered exponential backoff between tries: up to 0.25, 0.5, 1, 2, 4, 8 s
BACKOFF_MULTIPLIER_S = 0.25
BACKOFF_MAX_S = 8.0

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)

#: failures of the connection, not of the request: safe to try again
DROPPED: tuple[type[Exception], ...] = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
)


def is_refused(exc: BaseException) -> bool:
    """True when nothing listens where the gateway should be (connection refused): not
    transient, so a command says so at once instead of retrying for seconds.

    Example:
        >>> is_refused(requests.ConnectionError("... [Errno 111] Connection refused"))
        True
        >>> is_refused(requests.ConnectionError("Connection reset by peer"))
        False
    """
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ConnectionRefusedError):
            return True
        stack.extend([item.__cause__, item.__context__, getattr(item, "reason", None), *item.args])
    return "Connection refused" in str(exc) or "[Errno 111]" in str(exc)


class _Refused(Exception):
    """A refused connection, raised inside the retry loop so it is not retried."""

    def __init__(self, error: requests.ConnectionError) -> None:
        super().__init__(str(error))
        self.error = error


def _sleep(seconds: float) -> None:
    """Every wait of the client goes through here (tests replace it)."""
    time.sleep(seconds)


class _RetryableStatus(Exception):
    """A 429/502/503/504 answer, raised inside the retry loop so tenacity sees it."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        self.retry_after_s = parse_retry_after(response.headers.get("Retry-After"))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date).

    Example:
        >>> parse_retry_after("3")
        3.0
        >>> parse_retry_after(None) is None
        True
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@dataclass
class FailureRun:
    """Failures in a row: `count` drives the wait, `counted` (of the kinds that count
    toward giving up) the stop. A long-lived caller, such as an event stream, calls
    `reset()` when it makes progress, so a later drop starts again from the first,
    shortest wait and a full budget.

    Example:
        >>> run = FailureRun(count=4, counted=2)
        >>> run.reset(); (run.count, run.counted)
        (0, 0)
    """

    count: int = 0
    counted: int = 0

    def reset(self) -> None:
        self.count = self.counted = 0


class _CountFailure:
    """Tenacity's `after` hook: one more failure in the run (before wait and stop)."""

    def __init__(self, counted: tuple[type[BaseException], ...], run: FailureRun) -> None:
        self.counted, self.run = counted, run

    def __call__(self, retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        self.run.count += 1
        if isinstance(exc, self.counted):
            self.run.counted += 1


class _StopAfter:
    """Give up at the `limit`-th failure of a counted kind in a run (None: never)."""

    def __init__(self, limit: int | None, run: FailureRun) -> None:
        self.limit, self.run = limit, run

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.limit is not None and self.run.counted >= self.limit


class _WaitRetryAfterOrBackoff:
    """The server's Retry-After when it sent one, else full-jitter exponential backoff
    (tenacity's `wait_random_exponential` curve) over the failures of the run."""

    def __init__(self, multiplier_s: float, max_s: float, run: FailureRun) -> None:
        self.multiplier_s, self.max_s, self.run = multiplier_s, max_s, run

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, _RetryableStatus) and exc.retry_after_s is not None:
            return exc.retry_after_s
        exponent = max(self.run.count - 1, 0)
        return random.uniform(0, min(self.max_s, self.multiplier_s * 2.0**exponent))


def retrying(
    max_attempts: int | None,
    *,
    retry_on: tuple[type[BaseException], ...] = DROPPED,
    never_on: tuple[type[BaseException], ...] = (),
    counted: tuple[type[BaseException], ...] | None = None,
    multiplier_s: float = BACKOFF_MULTIPLIER_S,
    max_wait_s: float = BACKOFF_MAX_S,
    on_retry: Callable[[BaseException, float], None] | None = None,
    sleep: Callable[[float], None] | None = None,
    run: FailureRun | None = None,
) -> Retrying:
    """The client's one retry policy (tenacity), for requests, event streams and the
    notebook monitor alike: on an exception of `retry_on` (but not of `never_on`),
    wait (the server's
    Retry-After when it sent one, else full-jitter exponential backoff of
    `multiplier_s` doubling up to `max_wait_s`) and try again; give up, re-raising
    the last exception, at the `max_attempts`-th failure of a `counted` kind (all
    retried kinds by default; None: never give up). `on_retry(exc, wait_s)` is told
    before each wait; `sleep` waits (default `_sleep`, which tests replace); `run`
    counts the failures (a caller that makes progress resets it).

    Example:
        >>> calls = []
        >>> def flaky():
        ...     calls.append(1)
        ...     if len(calls) < 3:
        ...         raise requests.ConnectionError("reset")
        ...     return "ok"
        >>> retrying(5, sleep=lambda s: None)(flaky), len(calls)
        ('ok', 3)
    """
    run = run if run is not None else FailureRun()
    return Retrying(
        after=_CountFailure(retry_on if counted is None else counted, run),
        stop=_StopAfter(max_attempts, run),
        wait=_WaitRetryAfterOrBackoff(multiplier_s, max_wait_s, run),
        retry=retry_if_exception_type(retry_on) & retry_if_not_exception_type(never_on),
        sleep=sleep if sleep is not None else (lambda seconds: _sleep(seconds)),
        before_sleep=(
            None
            if on_retry is None
            else lambda rs: on_retry(
                rs.outcome.exception() if rs.outcome else RuntimeError("retry"),  # type: ignore[arg-type]
                rs.next_action.sleep if rs.next_action else 0.0,
            )
        ),
        reraise=True,
    )


def render_detail(body: Any) -> str:
    """A readable message from an error body: FastAPI's `detail` string or its
    list of pydantic errors ("field: message" joined by "; ").

    Example:
        >>> render_detail({"detail": [{"loc": ["body", "resources", "nodes"], "msg": "too big"}]})
        'resources.nodes: too big'
    """
    detail = body.get("detail", body) if isinstance(body, Mapping) else body
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, Mapping):
                loc = [str(p) for p in item.get("loc", ()) if p not in ("body", "query", "path")]
                msg = str(item.get("msg", item))
                parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def _body_of(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text.strip()[:500] or None


def error_for_response(
    response: requests.Response, *, base_url: str = "", auth_message: str | None = None
) -> ApiError:
    """The most specific `ApiError` for an error answer. A 401 says `auth_message` when
    given (the client's one message for a refused token, whatever the route answered).

    Example:
        >>> r = requests.Response(); r.status_code = 404; r._content = b'{"detail": "no job j"}'
        >>> str(error_for_response(r))
        'no job j (HTTP 404)'
    """
    status = response.status_code
    body = _body_of(response)
    message = render_detail(body) if body not in (None, "") else ""
    if not message:
        message = response.reason or f"HTTP error from {response.url or base_url}"
    if status == 401 and auth_message:
        return AuthError(status, auth_message, body=body)
    if status == 401:
        return AuthError(
            status,
            f"{message}; check the token (AIR_TOKEN or {config_file()}, written by"
            " `air gateway start`)",
            body=body,
        )
    if status == 404:
        return NotFoundError(status, message, body=body)
    if status == 409:
        return ConflictError(status, message, body=body)
    if status == 422 and re.search(r"idempotency[- ]key", message, re.IGNORECASE):
        return IdempotencyError(status, message, body=body)
    if status == 429:
        return RateLimitedError(status, f"{message}; slow down or try again later", body=body)
    return ApiError(status, message, body=body)


def _describe_transport_error(exc: BaseException) -> str:
    if isinstance(exc, requests.Timeout):
        return "the request timed out"
    text = str(exc)
    # urllib3 nests the useful part ("Connection refused") deep in a long repr.
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if match:
        return match.group(1).strip()
    return text or type(exc).__name__


class HttpTransport:
    """Authenticated, retrying requests against one gateway.

    Example:
        >>> t = HttpTransport("http://127.0.0.1:8470", token="t", timeout_s=5)
        >>> t.url("/v1/health")
        'http://127.0.0.1:8470/v1/health'
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        timeout_s: float,
        session: requests.Session | None = None,
        max_attempts: int = 6,
        user_agent: str = "air-sdk",
        auth_message: str | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts={max_attempts} must be >= 1")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.session = session if session is not None else requests.Session()
        #: what a 401 says, on every route (see `Client`); None: the gateway's words
        self.auth_message = auth_message
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def close(self) -> None:
        self.session.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        allow_statuses: frozenset[int] = frozenset(),
        stream: bool = False,
        timeout: float | tuple[float, float] | None = None,
    ) -> requests.Response:
        """Send one request with retries; return the response or raise an `AirError`.

        Statuses in `allow_statuses` (e.g. 404 for `HEAD /v1/bundles/...`) are
        returned instead of raised.
        """
        merged = {**self._headers, **(headers or {})}
        clean_params = {k: _param(v) for k, v in (params or {}).items() if v is not None}

        def send() -> requests.Response:
            try:
                response = self.session.request(
                    method,
                    self.url(path),
                    params=clean_params or None,
                    json=json,
                    data=data,
                    headers=merged,
                    stream=stream,
                    timeout=timeout if timeout is not None else self.timeout_s,
                )
            except requests.ConnectionError as exc:
                if is_refused(exc):
                    raise _Refused(exc) from exc
                raise
            if response.status_code in RETRY_STATUSES and response.status_code not in (
                allow_statuses
            ):
                _ = response.content  # keep the error body readable once the socket is gone
                response.close()
                raise _RetryableStatus(response)
            return response

        response = self._with_retries(send)
        if response.status_code >= 400 and response.status_code not in allow_statuses:
            error = error_for_response(
                response, base_url=self.base_url, auth_message=self.auth_message
            )
            response.close()
            raise error
        return response

    def _with_retries(self, send: Callable[[], _T]) -> _T:
        policy = retrying(self.max_attempts, retry_on=(_RetryableStatus, *DROPPED))
        try:
            return policy(send)
        except _RetryableStatus as exc:
            raise error_for_response(
                exc.response, base_url=self.base_url, auth_message=self.auth_message
            ) from exc
        except _Refused as exc:  # nothing listens there: say so now, no retries
            raise self.transport_error(exc.error) from exc.error
        except requests.RequestException as exc:  # dropped, or e.g. an invalid URL
            raise self.transport_error(exc) from exc

    def transport_error(self, exc: BaseException) -> TransportError:
        """The error for a gateway that cannot be reached (used by streams too)."""
        return TransportError(
            f"could not reach the gateway at {self.base_url}: {_describe_transport_error(exc)};"
            " start one with `air gateway start`"
        )


def parse_model(model: type[_M], response: requests.Response) -> _M:
    """The answer's body as `model`; anything else is an `ApiError` that says so.

    Example:
        >>> from air_sdk.schema import Health
        >>> parse_model(Health, mock_response(200, {"version": "1"})).version
        '1'
    """
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        # A gateway of another version, or something else listening on the port.
        first = render_detail({"detail": exc.errors()[:1]})
        raise ApiError(
            response.status_code,
            f"unexpected answer from {response.url}: not a {model.__name__}"
            f" ({exc.error_count()} problems, first: {first});"
            " is the gateway the same AIR version as this client?",
        ) from exc


def _param(value: Any) -> Any:
    # Enums (JobState) go on the wire by value.
    return getattr(value, "value", value)


# -- the test seam -------------------------------------------------------------


class _ChunkReader:
    """A stand-in for urllib3's raw response: hands out chunks; an exception
    among them is raised when reached (a dropped connection mid-stream)."""

    def __init__(self, chunks: Iterable[bytes | BaseException]) -> None:
        self._chunks = iter(chunks)
        self.closed = False

    def read(self, amt: int | None = None, **_: Any) -> bytes:
        if self.closed:
            return b""
        for chunk in self._chunks:
            if isinstance(chunk, BaseException):
                raise chunk
            if chunk:
                return chunk
        return b""

    def close(self) -> None:
        self.closed = True


def mock_response(
    status: int = 200,
    json: Any = None,
    *,
    content: bytes | str = b"",
    chunks: Iterable[bytes | BaseException] | None = None,
    headers: Mapping[str, str] | None = None,
) -> requests.Response:
    """A `requests.Response` for a `MockAdapter` handler to return.

    `json` is serialized (pydantic models too); `chunks` streams a body piece by
    piece and may hold an exception to raise mid-body.

    Example:
        >>> mock_response(404, {"detail": "no job x"}).status_code
        404
    """
    import json as _json

    if json is not None:
        content = json.model_dump_json() if hasattr(json, "model_dump_json") else _json.dumps(json)
        headers = {"Content-Type": "application/json", **(headers or {})}
    body = content.encode() if isinstance(content, str) else content
    response = requests.Response()
    response.status_code = status
    response.headers = CaseInsensitiveDict(headers or {})
    response.raw = _ChunkReader(chunks if chunks is not None else [body])
    response.reason = ""
    return response


class MockAdapter(BaseAdapter):
    """A fake network: every request goes to `handler(request)`, which returns a
    response (see `mock_response`) or raises, e.g. `requests.ConnectionError`.

    Example:
        >>> session = mock_session(lambda request: mock_response(200, {"status": "ok", "version": "t"}))
        >>> session.get("http://gw/v1/health").json()["version"]
        't'
    """

    def __init__(self, handler: Callable[[requests.PreparedRequest], requests.Response]) -> None:
        super().__init__()
        self.handler = handler
        self.requests: list[requests.PreparedRequest] = []

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        self.requests.append(request)
        response = self.handler(request)
        response.request = request
        response.url = request.url or ""
        return response

    def close(self) -> None:
        pass


def mock_session(
    handler: Callable[[requests.PreparedRequest], requests.Response],
) -> requests.Session:
    """A `requests.Session` whose every request is answered by `handler`.

    Example:
        >>> from air_sdk.client import Client
        >>> answer = mock_response(200, {"status": "ok", "version": "0.1.0"})
        >>> client = Client("http://gw", token="t", session=mock_session(lambda r: answer))
        >>> client.health().version
        '0.1.0'
    """
    session = requests.Session()
    adapter = MockAdapter(handler)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
