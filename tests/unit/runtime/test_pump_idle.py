"""A rank's last lines are never cut off at its exit: the NodeRunner stops waiting for
its output only when the pipe is empty *and* the pump handled every line it read (a
job's last line, its RESULT, went missing under load when a few lines still sat in the
pump's buffer)."""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from air_sdk.runtime.supervise import pump_output


class SlowSink:
    """A shipper that takes its time with each line, as one under load does."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add_line(self, line: str) -> None:
        time.sleep(0.01)
        self.lines.append(line)


def test_idle_means_every_line_read_was_handled() -> None:
    read_fd, write_fd = os.pipe()
    sink, tail, idle = SlowSink(), deque[str](), threading.Event()
    stream = os.fdopen(read_fd, "rb")
    # the rank wrote its last lines and exited before the pump got to them
    os.write(write_fd, b"".join(b"line %d\n" % i for i in range(100)))
    out = open(os.devnull, "wb")  # noqa: SIM115
    pump = threading.Thread(
        target=pump_output, args=(stream, 0, tail, threading.Lock(), sink, out, idle)
    )
    pump.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # the pipe is drained at once into the pump's buffer; idle waits for the lines
        if idle.is_set():
            break
        time.sleep(0.001)
    assert idle.is_set()
    assert len(sink.lines) == 100 and sink.lines[-1] == "line 99"
    os.close(write_fd)
    pump.join(10)
    assert not pump.is_alive()
