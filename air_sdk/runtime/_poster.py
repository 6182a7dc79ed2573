"""Posts serialized WorkerReports to the gateway: the runtime's only network I/O.

One `requests.Session` per poster; transport errors, 429, 502, 503 and 504 are
retried with jittered exponential backoff (honouring Retry-After) within a
bounded time per post. 409 (a fenced, stale attempt) and 401/403/404 stop all
posting; any other refusal drops that one report.

Reports go as msgpack (`application/msgpack`, points as columns) where the caller can
encode them so; a gateway that answers such a post 415 (it reads only JSON) or refuses
it where the same report as JSON is taken (an older gateway that read every body as
JSON) gets JSON from then on.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from enum import Enum
from urllib.parse import quote

import requests
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_before_delay,
    stop_when_event_set,
    wait_fixed,
    wait_random_exponential,
)

from air_sdk.runtime._context import Context

__all__ = ["JSON_TYPE", "MSGPACK_TYPE", "PostOutcome", "ReportPoster", "report_url", "warn"]

JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"

_RETRY_STATUSES = frozenset({429, 502, 503, 504})
_MAX_RETRY_AFTER_S = 60.0
_BACKOFF = wait_fixed(0.05) + wait_random_exponential(multiplier=0.1, max=2.0)


def warn(message: str) -> None:
    print(f"air: {message}", file=sys.stderr, flush=True)


def report_url(ctx: Context) -> str:
    """The gateway endpoint this rank posts its reports to.

    Example:
        >>> report_url(Context(job_id="j1", attempt=2, gateway_url="http://gw:8470/"))
        'http://gw:8470/v1/jobs/j1/attempts/2/report'
    """
    base = (ctx.gateway_url or "").rstrip("/")
    return f"{base}/v1/jobs/{quote(ctx.job_id or '', safe='')}/attempts/{ctx.attempt}/report"


class PostOutcome(Enum):
    DELIVERED = "delivered"
    REJECTED = "rejected"  # the gateway refused this report; retrying would not help: drop it
    STOPPED = "stopped"  # fenced (409) or not allowed (401/403/404): post nothing more
    FAILED = "failed"  # unreachable within the time budget: keep the data, try again later


class _Retryable(Exception):
    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


class ReportPoster:
    """Posts WorkerReport bodies over one `requests.Session`, with bounded retries.

    Transport errors, 429, 502, 503 and 504 are retried with jittered backoff
    (honouring Retry-After) for at most `max_post_s` per post.

    Example:
        >>> poster = ReportPoster("http://127.0.0.1:8470/v1/jobs/j/attempts/0/report", "tok")
        >>> poster.url.endswith("/report")
        True
    """

    def __init__(self, url: str, token: str | None, *, max_post_s: float = 10.0) -> None:
        self.url = url
        self.max_post_s = max_post_s
        self._session = requests.Session()
        #: whether the gateway is still believed to read msgpack reports
        self.takes_msgpack = True
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._abort = threading.Event()
        self._not_before = 0.0  # a Retry-After that outlived the last post's budget
        self._warned: set[int] = set()
        self._last_refusal = 0  # the status of the last post's refusal, 0 if none

    def abort(self) -> None:
        """Give up on the post in progress and any later one (used by a timed-out close)."""
        self._abort.set()

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    def post(
        self,
        body: bytes,
        *,
        content_type: str = JSON_TYPE,
        as_json: Callable[[], bytes] | None = None,
    ) -> PostOutcome:
        """Post one serialized WorkerReport; never raises. With `as_json` (the same report
        as JSON), a refusal of `body` (415, or 422 where the JSON is then taken) is
        answered by posting the JSON, and by posting JSON only from then on."""
        if as_json is None:
            return self._post(body, content_type)
        outcome = self._post(body, content_type, quiet=(415, 422))
        refused = self._last_refusal
        if outcome is not PostOutcome.REJECTED or refused not in (415, 422):
            return outcome
        outcome = self._post(as_json(), JSON_TYPE)
        if refused == 415 or outcome is PostOutcome.DELIVERED:
            self.takes_msgpack = False
            warn(f"the gateway does not read msgpack reports (HTTP {refused}); posting JSON")
        return outcome

    def _post(self, body: bytes, content_type: str, *, quiet: tuple[int, ...] = ()) -> PostOutcome:
        self._last_refusal = 0
        delay = self._not_before - time.monotonic()
        if delay > 0 and (self._abort.wait(min(delay, self.max_post_s)) or delay > self.max_post_s):
            return PostOutcome.FAILED
        deadline = time.monotonic() + self.max_post_s
        retrying = Retrying(
            retry=retry_if_exception_type(_Retryable),
            wait=self._wait,
            stop=stop_before_delay(self.max_post_s) | stop_when_event_set(self._abort),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._post_once(body, content_type, deadline)
        except _Retryable as exc:
            if exc.retry_after:
                self._not_before = time.monotonic() + exc.retry_after
            return PostOutcome.FAILED
        except _Refused as exc:
            if exc.status in (0, 401, 403, 404, 409):
                warn(f"{exc}; this process sends no more metrics or logs")
                return PostOutcome.STOPPED
            self._last_refusal = exc.status
            if exc.status not in self._warned and exc.status not in quiet:
                self._warned.add(exc.status)
                warn(f"{exc}; that report is dropped")
            return PostOutcome.REJECTED
        return PostOutcome.DELIVERED

    def _post_once(self, body: bytes, content_type: str, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Retryable()
        try:
            response = self._session.post(
                self.url,
                data=body,
                headers={"Content-Type": content_type},
                timeout=(min(3.0, remaining), remaining),
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise _Retryable() from exc
        except requests.RequestException as exc:
            raise _Refused(0, f"cannot post to AIR_GATEWAY_URL ({exc})") from exc
        status = response.status_code
        detail = response.text[:300]  # also returns the connection to the pool
        if status < 300:
            return
        if status in _RETRY_STATUSES:
            raise _Retryable(_retry_after(response.headers.get("Retry-After")))
        if status == 409:
            raise _Refused(status, "the gateway fenced this attempt (HTTP 409: a newer one runs)")
        if status in (401, 403):
            raise _Refused(status, f"the gateway refused AIR_JOB_TOKEN (HTTP {status})")
        if status == 404:
            raise _Refused(status, f"no such job or attempt at {self.url} (HTTP 404)")
        raise _Refused(status, f"the gateway refused a report (HTTP {status}: {detail})")

    def _sleep(self, seconds: float) -> None:
        self._abort.wait(seconds)  # a timed-out close() cuts the backoff short

    @staticmethod
    def _wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            return exc.retry_after
        return float(_BACKOFF(state))
