"""The per-address connection cap and the stream counter, without a server."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from air_sdk.gateway.connections import ConnectionGuard
from air_sdk.gateway.streams import OpenStreams


class Conn:
    def __init__(self, waiting: bool) -> None:
        self.waiting, self.closed = waiting, False

    def waiting_for_headers(self) -> bool:
        return self.waiting and not self.closed

    def close(self) -> None:
        self.closed = True


def test_past_the_cap_the_oldest_waiting_connection_makes_room():
    guard = ConnectionGuard(max_per_address=2)
    busy, waiting, new = Conn(False), Conn(True), Conn(False)
    assert guard.admit(busy, "10.0.0.1") and guard.admit(waiting, "10.0.0.1")
    assert guard.admit(new, "10.0.0.1")
    assert waiting.closed and not busy.closed and guard.count("10.0.0.1") == 2
    assert guard.admit(Conn(True), "10.0.0.2")  # another address has its own cap


def test_an_address_whose_connections_are_all_busy_is_refused_until_one_closes():
    guard = ConnectionGuard(max_per_address=1)
    busy = Conn(False)
    assert guard.admit(busy, "10.0.0.1")
    assert not guard.admit(Conn(True), "10.0.0.1")
    guard.release(busy, "10.0.0.1")
    assert guard.admit(Conn(True), "10.0.0.1")


def test_stream_slots_are_given_back_and_the_refusal_says_the_cap():
    streams = OpenStreams(max_per_tenant=2, max_per_token=5)
    with streams.hold("acme", "a"), streams.hold("acme", "b"):
        with pytest.raises(HTTPException) as refused, streams.hold("acme", "c"):
            pass
        assert refused.value.status_code == 429
        assert "2 event streams open" in refused.value.detail
        assert "close streams" in refused.value.detail
        with streams.hold("globex", "d"):
            assert streams.count("globex") == 1
    assert streams.count("acme") == 0
    with pytest.raises(ValueError, match="at least 1"):
        OpenStreams(max_per_tenant=0, max_per_token=None)
