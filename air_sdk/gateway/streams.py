"""Event streams (`GET /v1/jobs/{id}/events/stream`): how many one caller may hold open,
and how an open one waits for news without costing the others.

One member with 341 open streams raised another tenant's median latency from 9 ms to
1.35 s: every stream asked the database (in a worker thread) for its job's state ten
times a second. Now

- a tenant holds at most `RequestLimits.max_streams_per_tenant` streams and a token
  at most `max_streams_per_token`; one more is refused with 429, saying the cap and
  how to close streams. A stream's slot is taken before the answer starts and
  given back when it ends, however it ends;
- an open stream polls the in-memory last sequence number of its job (no SQL, no
  thread) and reads the job's state only every `STATE_POLL_S`, or at once when a
  state event went by.

Example:
    >>> streams = OpenStreams(max_per_tenant=2, max_per_token=1)
    >>> with streams.hold("acme", "token-a"):
    ...     streams.count("acme")
    1
    >>> streams.count("acme")
    0
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import ServerSentEvent

from air_sdk.gateway.app import GatewayContext, PrincipalDep, bearer_token, get_ctx
from air_sdk.gateway_config import RequestLimits
from air_sdk.schema import EventType

__all__ = ["OpenStreams", "StreamSlot", "job_event_stream", "open_streams"]

#: how often an open stream looks for new events (memory only)
POLL_S = 0.1
#: how often it reads its job's state from the store when no state event went by
STATE_POLL_S = 2.0
#: events read from the store at a time
READ_EVENTS = 1000


class OpenStreams:
    """Open event streams per tenant and per token (by its digest), for one gateway
    process; one event loop uses it."""

    def __init__(self, *, max_per_tenant: int | None, max_per_token: int | None) -> None:
        for name, cap in (("max_per_tenant", max_per_tenant), ("max_per_token", max_per_token)):
            if cap is not None and cap < 1:
                raise ValueError(f"{name} must be at least 1 or None (no cap), not {cap}")
        self.max_per_tenant = max_per_tenant
        self.max_per_token = max_per_token
        self._tenants: Counter[str] = Counter()
        self._tokens: Counter[str] = Counter()

    @classmethod
    def from_limits(cls, limits: RequestLimits) -> OpenStreams:
        return cls(
            max_per_tenant=limits.max_streams_per_tenant,
            max_per_token=limits.max_streams_per_token,
        )

    def count(self, tenant: str) -> int:
        """Streams `tenant` holds open now."""
        return self._tenants[tenant]

    @contextmanager
    def hold(self, tenant: str, token: str) -> Iterator[None]:
        """A stream slot of `tenant` and `token` for the body's duration; HTTP 429 when
        either is at its cap."""
        key = hashlib.sha256(token.encode()).hexdigest()
        refusal = self._refusal(tenant, key)
        if refusal is not None:
            raise HTTPException(429, refusal)
        self._tenants[tenant] += 1
        self._tokens[key] += 1
        try:
            yield
        finally:
            for counter, name in ((self._tenants, tenant), (self._tokens, key)):
                counter[name] -= 1
                if counter[name] <= 0:
                    del counter[name]

    def _refusal(self, tenant: str, key: str) -> str | None:
        how = (
            "; close streams you no longer read (stop `air logs --follow` / `air submit"
            " --follow`, close notebook monitors), or page `GET /v1/jobs/{id}/events"
            "?after=N&wait=30` instead"
        )
        if self.max_per_token is not None and self._tokens[key] >= self.max_per_token:
            return f"this token has {self._tokens[key]} event streams open, the cap{how}"
        if self.max_per_tenant is not None and self._tenants[tenant] >= self.max_per_tenant:
            return (
                f"tenant {tenant!r} has {self._tenants[tenant]} event streams open, the"
                f" cap{how}; an operator raises it with RequestLimits.max_streams_per_tenant"
            )
        return None


def open_streams(request: Request) -> OpenStreams:
    """The app's stream counter (`app.state.streams`, made by `create_app`)."""
    streams: OpenStreams = request.app.state.streams
    return streams


async def _stream_slot(request: Request, principal: PrincipalDep) -> AsyncIterator[None]:
    # A yield dependency of the default ("request") scope ends after the answer is
    # sent: for a stream, once it has ended or its reader left.
    with open_streams(request).hold(principal.tenant, bearer_token(request) or ""):
        yield


#: a route parameter that takes a stream slot before the answer starts (or answers 429)
StreamSlot = Annotated[None, Depends(_stream_slot)]


async def job_event_stream(
    request: Request, job_id: str, after: int
) -> AsyncIterator[ServerSentEvent]:
    """Every event of `job_id` after `after`, then new ones as they come; ends once the
    job has ended and every event is sent, or when the reader leaves."""
    ctx = get_ctx(request)
    loop = asyncio.get_running_loop()
    next_state_check = 0.0  # now: a job that already ended ends its stream at once
    while True:
        if ctx.store.last_seq(job_id) > after:
            events = await run_in_threadpool(
                ctx.store.read_events, job_id, after=after, limit=READ_EVENTS
            )
            for e in events:
                yield ServerSentEvent(raw_data=e.model_dump_json(), id=str(e.seq), event="event")
                after = e.seq
                if e.type is EventType.STATE:
                    next_state_check = 0.0  # it may have ended: look now, not later
            continue
        if loop.time() >= next_state_check:
            next_state_check = loop.time() + STATE_POLL_S
            if await _ended(ctx, job_id, after):
                return
        if await request.is_disconnected():
            return
        await asyncio.sleep(POLL_S)


async def _ended(ctx: GatewayContext, job_id: str, after: int) -> bool:
    job = await run_in_threadpool(ctx.store.get_job, job_id)
    return job is None or (job.state.terminal and ctx.store.last_seq(job_id) <= after)
