"""The text/event-stream parser."""

from __future__ import annotations

from air_sdk.client.sse import SseMessage, iter_lines, iter_sse


def test_multiline_data_ids_and_comments() -> None:
    body = [
        b": ping\n\n",
        b"id: 1\ndata: first\n\n",
        b"event: log\ndata: line one\ndata: line two\nid: 2\n\n",
        b": keepalive\n",
        b"data:no-space\n\n",
    ]
    assert list(iter_sse(body)) == [
        SseMessage(data="first", id="1"),
        SseMessage(data="line one\nline two", event="log", id="2"),
        # The last id carries over to later messages, as the spec says.
        SseMessage(data="no-space", id="2"),
    ]


def test_messages_split_across_chunks_and_crlf() -> None:
    body = [b"id: 7\r", b'\ndata: {"a"', b": 1}\r\n", b"\r\n", b"retry: 500\rdata: x\r\r"]
    assert list(iter_sse(body)) == [
        SseMessage(data='{"a": 1}', id="7"),
        SseMessage(data="x", id="7", retry_ms=500),
    ]


def test_unicode_line_separators_do_not_split_lines() -> None:
    text = 'data: {"t": "a\u2028b\x0cc"}\n\n'.encode()
    assert [m.data for m in iter_sse([text])] == ['{"t": "a\u2028b\x0cc"}']


def test_truncated_message_is_not_dispatched() -> None:
    assert list(iter_sse([b"id: 1\ndata: whole\n\nid: 2\ndata: cut off"])) == [
        SseMessage(data="whole", id="1")
    ]


def test_events_without_data_are_dropped_and_lines_split_correctly() -> None:
    assert list(iter_sse([b"event: noop\n\n"])) == []
    assert list(iter_lines([b"a\r", b"\r\n", b"b"])) == ["a", "", "b"]
