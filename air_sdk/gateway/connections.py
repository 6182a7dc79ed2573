"""Connections before they are requests: a header-read timeout and a per-address cap.

uvicorn closes idle keep-alive connections, but a connection that sends half a
request line and then nothing (slowloris) is kept forever, and uvicorn accepts as
many as the process has file descriptors: 1,100 of them from one address starved
health checks, listings and submits alike. `guarded_protocol` wraps uvicorn's HTTP
protocol so that

- a connection whose request headers are not complete `header_timeout_s` after it
  opened (or after its previous response) is closed;
- one address holds at most `max_per_address` connections: a new one past the cap
  closes that address's oldest connection still waiting for its headers (so a
  flood of half-open sockets cannot lock out a real client behind the same
  address, which sends its request at once), and is refused when all of them are
  busy with requests.

`raise_fd_limit` lifts the process's soft open-files limit to its hard limit at
start (the default 1,024 is what the flood exhausted).

Example:
    >>> guard = ConnectionGuard(max_per_address=2)
    >>> a, b, c = _Waiting(), _Waiting(), _Waiting()
    >>> guard.admit(a, "10.0.0.1"), guard.admit(b, "10.0.0.1"), guard.admit(c, "10.0.0.1")
    (True, True, True)
    >>> a.closed, guard.count("10.0.0.1")
    (True, 2)
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from typing import Any, Protocol

log = logging.getLogger(__name__)

__all__ = ["ConnectionGuard", "guarded_protocol", "raise_fd_limit"]


class Guarded(Protocol):
    """What the guard needs of a connection."""

    def waiting_for_headers(self) -> bool: ...

    def close(self) -> None: ...


class ConnectionGuard:
    """Open connections per client address, oldest first; one event loop uses it (no
    locking). See the module docstring for the rule."""

    def __init__(self, max_per_address: int) -> None:
        if max_per_address < 1:
            raise ValueError(f"max_per_address must be at least 1, not {max_per_address}")
        self.max_per_address = max_per_address
        self._open: dict[str, OrderedDict[Guarded, None]] = {}

    def admit(self, conn: Guarded, address: str | None) -> bool:
        """Register `conn` from `address`; False when it must be closed (the address
        is at its cap and none of its connections is still waiting for headers)."""
        if address is None:  # a Unix socket: no address to count by
            return True
        held = self._open.setdefault(address, OrderedDict())
        if len(held) >= self.max_per_address:
            oldest = next((c for c in held if c.waiting_for_headers()), None)
            if oldest is None:
                return False
            del held[oldest]
            oldest.close()
        held[conn] = None
        return True

    def release(self, conn: Guarded, address: str | None) -> None:
        """`conn` closed (idempotent)."""
        held = self._open.get(address) if address is not None else None
        if held is None:
            return
        held.pop(conn, None)
        if not held:
            del self._open[address]  # type: ignore[arg-type]

    def count(self, address: str) -> int:
        """Connections `address` holds now."""
        return len(self._open.get(address, ()))


class _Waiting:
    """A connection that never sends its headers (for the doctest)."""

    closed = False

    def waiting_for_headers(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


def guarded_protocol(
    base: type[asyncio.Protocol], guard: ConnectionGuard, header_timeout_s: float
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `base` (h11 or httptools: both keep the request in
    progress in `cycle`) with the header timeout and `guard`'s cap; hand it to
    `uvicorn.Config(http=...)`."""
    if header_timeout_s <= 0:
        raise ValueError(f"header_timeout_s must be positive, not {header_timeout_s}")

    class GuardedHTTPProtocol(base):  # type: ignore[valid-type,misc]
        _air_timer: asyncio.TimerHandle | None = None
        #: the request cycle when the timer was armed: a new one means headers arrived
        _air_waiting_since: Any = None
        _air_address: str | None = None
        _air_closed = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            client = self.client
            self._air_address = client[0] if client else None
            if not guard.admit(self, self._air_address):
                log.warning("refused a connection from %s: at its cap", self._air_address)
                self.close()
                return
            self._air_arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._air_arm()  # the next request's headers get the same time

        def connection_lost(self, exc: Exception | None) -> None:
            self._air_closed = True
            self._air_cancel()
            guard.release(self, self._air_address)
            super().connection_lost(exc)

        def waiting_for_headers(self) -> bool:
            return not self._air_closed and self.cycle is self._air_waiting_since

        def close(self) -> None:
            self._air_closed = True
            self._air_cancel()
            self.transport.close()

        def _air_arm(self) -> None:
            self._air_cancel()
            self._air_waiting_since = self.cycle
            self._air_timer = self.loop.call_later(header_timeout_s, self._air_timed_out)

        def _air_cancel(self) -> None:
            if self._air_timer is not None:
                self._air_timer.cancel()
                self._air_timer = None

        def _air_timed_out(self) -> None:
            self._air_timer = None
            if self.waiting_for_headers() and not self.transport.is_closing():
                self.close()

    return GuardedHTTPProtocol


def raise_fd_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) after.

    Example:
        >>> soft, hard = raise_fd_limit()
        >>> soft == hard or hard == resource.RLIM_INFINITY
        True
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit on macOS
            log.warning("could not raise the open-files limit from %s: %s", soft, exc)
    return soft, hard
