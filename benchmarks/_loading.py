"""What the data-loading benchmark measures, importable by AIR's interpreter and by the
separate one Streaming runs in (`_streaming_peer.py`): only the stdlib and psutil."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil


class PeakRss:
    """The peak memory of this process and its workers, sampled every 50 ms: the sum of
    their PSS (forked workers share pages copy-on-write; summing RSS would count the
    shared pages once per process)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_full_info().pss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read_rate(batches: Any, num: int, batch_size: int) -> tuple[float, int]:
    """Samples/s over `num` batches after the first (workers starting is not reading),
    and the peak PSS meanwhile."""
    with PeakRss() as rss:
        it = iter(batches)
        next(it)
        start = time.perf_counter()
        for _ in range(num):
            next(it)
        elapsed = time.perf_counter() - start
    return num * batch_size / elapsed, rss.peak
