"""A small server-sent events parser (the WHATWG `text/event-stream` rules).

`iter_sse` turns raw byte chunks into `SseMessage`s: `data:` lines are joined
with newlines, `id:` is kept, comment lines (`: ping`) and unknown fields are
ignored, and a blank line dispatches. Lines end with `\\n`, `\\r\\n` or `\\r`
and nothing else (so a `\\u2028` inside JSON data does not split a line, as
`str.splitlines` would).

Example:
    >>> msgs = list(iter_sse([b": ping\\n\\n", b'id: 3\\ndata: {"seq": 3}\\n\\n']))
    >>> msgs[0].id, msgs[0].data
    ('3', '{"seq": 3}')
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["SseMessage", "iter_lines", "iter_sse"]


@dataclass(frozen=True)
class SseMessage:
    """One dispatched event of a stream.

    Example:
        >>> SseMessage(data="{}", event="message", id="7").id
        '7'
    """

    data: str
    event: str = "message"
    id: str | None = None
    retry_ms: int | None = None


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Split byte chunks into decoded lines on `\\n`, `\\r\\n` or `\\r` only.

    Example:
        >>> list(iter_lines([b"a\\r", b"\\nb\\rc\\n"]))
        ['a', 'b', 'c']
    """
    buffer = b""
    skip_lf = False  # the previous chunk ended in "\r": a leading "\n" belongs to it
    for chunk in chunks:
        if not chunk:
            continue
        if skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        skip_lf = False
        buffer += chunk
        start = 0
        while True:
            cut = _first_eol(buffer, start)
            if cut < 0:
                break
            yield buffer[start:cut].decode("utf-8", errors="replace")
            if buffer[cut : cut + 2] == b"\r\n":
                start = cut + 2
            else:
                start = cut + 1
                skip_lf = buffer[cut : cut + 1] == b"\r" and start == len(buffer)
        buffer = buffer[start:]
    if buffer:
        yield buffer.decode("utf-8", errors="replace")


def _first_eol(buffer: bytes, start: int) -> int:
    positions = [p for p in (buffer.find(b"\n", start), buffer.find(b"\r", start)) if p >= 0]
    return min(positions) if positions else -1


def iter_sse(chunks: Iterable[bytes]) -> Iterator[SseMessage]:
    """Parse a `text/event-stream` body into messages (see the module docstring).

    Example:
        >>> [m.data for m in iter_sse([b"data: a\\ndata: b\\n\\n"])]
        ['a\\nb']
    """
    data: list[str] = []
    event = ""
    last_id: str | None = None
    retry_ms: int | None = None
    for line in iter_lines(chunks):
        if not line:
            if data:
                yield SseMessage(
                    data="\n".join(data), event=event or "message", id=last_id, retry_ms=retry_ms
                )
            data, event, retry_ms = [], "", None
            continue
        if line.startswith(":"):
            continue  # a comment: keep-alive pings
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            if "\x00" not in value:
                last_id = value  # the spec keeps the last id across messages
        elif name == "retry" and value.isdigit():
            retry_ms = int(value)
    # A stream cut mid-message dispatches nothing: the reader reconnects from the last id.
