"""Moves metrics, output lines and heartbeats off the training thread to the gateway.

`MetricsShipper.log()` only converts values to float and appends a tuple to a
deque under an uncontended lock; a daemon thread drains the deque every
`flush_interval` (or early, once `batch_size` points wait), and posts one
`WorkerReport` per batch through `ReportPoster`, the only code that does I/O: as
msgpack with the points as columns (`air_sdk.schema.columns`), or as JSON to a gateway
that does not read msgpack.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import operator
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from air_sdk.runtime._context import context, job_token
from air_sdk.runtime._poster import MSGPACK_TYPE, PostOutcome, ReportPoster, report_url, warn
from air_sdk.runtime._throughput import TOKENS, ThroughputMeter, meter_from_env
from air_sdk.schema.columns import COLUMNS_KEY, to_columns
from air_sdk.schema.events import (
    MAX_LOG_LINE_CHARS,
    MAX_LOG_LINES_PER_REPORT,
    MAX_POINTS_PER_REPORT,
    RankExit,
)

try:
    import msgpack
except ImportError:  # installed without the train extra: reports go as JSON
    msgpack = None

__all__ = ["MetricsShipper", "get_shipper", "keep_alive", "shipper_from_env"]

_MAX_REPORT_LINE_CHARS = 1_000_000  # keeps one report's body around a megabyte
_LINE_OVERHEAD = 64  # about what a str object costs besides its characters
_MAX_PENDING_SAMPLES = 64


@dataclass(slots=True)
class _Batch:
    points: list[tuple[int, float, dict[str, float]]]
    lines: list[str]
    dropped_points: int = 0
    heartbeat_step: int | None = None
    exit: dict[str, Any] | None = field(default=None)
    samples: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    busy: bool = False
    finished: bool = False
    data: dict[str, Any] | None = None

    def to_msgpack(self, rank: int) -> bytes:
        """The report as msgpack, its points as columns: no object per point, and no
        float written as text (what JSON costs most here)."""
        body = self._fields(rank)
        if self.points:
            body[COLUMNS_KEY] = to_columns(self.points)
        packed: bytes = msgpack.packb(body)
        return packed

    def to_json(self, rank: int) -> bytes:
        # Plain dicts and json.dumps: no pydantic objects per point on any path.
        text = json.dumps(self._fields(rank), separators=(",", ":"))
        if self.points:
            text = f'{text[:-1]},"points":{_points_json(self.points)}}}'
        return text.encode()

    def _fields(self, rank: int) -> dict[str, Any]:
        body: dict[str, Any] = {"rank": rank}
        if self.lines:
            body["lines"] = self.lines
        if self.exit is not None:
            body["exit"] = self.exit
        if self.heartbeat_step is not None:
            body["heartbeat_step"] = self.heartbeat_step
        if self.dropped_points:
            body["dropped_points"] = self.dropped_points
        if self.samples:
            body["samples"] = self.samples
        if self.checkpoints:
            body["checkpoints"] = self.checkpoints
        if self.busy:
            body["busy"] = True
        if self.finished:
            body["finished"] = True
        if self.data is not None:
            body["data"] = self.data
        return body


#: points per json.dumps call: one call holds the GIL, and the training thread needs it
#: (500 took up to 12 ms on a busy 2-core VM; 100 keeps each hold near 2 ms)
_JSON_SLICE = 100


def _points_json(points: list[tuple[int, float, dict[str, float]]]) -> str:
    parts = [
        json.dumps(
            [{"step": s, "ts": t, "values": v} for s, t, v in points[i : i + _JSON_SLICE]],
            separators=(",", ":"),
        )[1:-1]
        for i in range(0, len(points), _JSON_SLICE)
    ]
    return "[" + ",".join(parts) + "]"


def _split(points: list, lines: list[str]) -> list[_Batch]:
    """Cut pending data into reports within the schema's per-report limits."""
    batches: list[_Batch] = []
    p = n = 0
    while True:
        p_end = min(p + MAX_POINTS_PER_REPORT, len(points))
        n_end, chars = n, 0
        while n_end < len(lines) and n_end - n < MAX_LOG_LINES_PER_REPORT:
            chars += len(lines[n_end])
            if chars > _MAX_REPORT_LINE_CHARS and n_end > n:
                break
            n_end += 1
        batches.append(_Batch(points[p:p_end], lines[n:n_end]))
        p, n = p_end, n_end
        if p >= len(points) and n >= len(lines):
            return batches


def _floats(values: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in values.items():
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError
            out[key] = float(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(
                f"air.log(): {key}={value!r:.60} is a {type(value).__name__}, not a number; "
                "pass a float, an int, a numpy scalar or a one-element tensor"
            ) from exc
    return out


class MetricsShipper:
    """Batches this rank's metrics, output lines and heartbeats and posts them in order.

    Without a poster (no gateway configured) `log()` only keeps `latest` and `last_step`.
    At most `max_pending` points wait; beyond that the oldest are dropped and counted
    in the next report's `dropped_points`. Output lines are bounded by
    `max_pending_line_bytes`; dropped ones leave an "[air] N ... dropped" line.

    Example:
        >>> shipper = MetricsShipper(rank=0, poster=None)
        >>> shipper.log(10, loss=0.5)
        >>> shipper.latest, shipper.last_step
        ({'loss': 0.5}, 10)
    """

    def __init__(
        self,
        rank: int = 0,
        poster: ReportPoster | None = None,
        *,
        flush_interval: float = 0.5,
        batch_size: int = 1000,
        max_pending: int = 200_000,
        max_pending_line_bytes: int = 16_000_000,
    ) -> None:
        if flush_interval <= 0 or min(batch_size, max_pending, max_pending_line_bytes) < 1:
            raise ValueError("flush_interval must be > 0 and batch_size, max_pending* >= 1")
        self.rank = rank
        self.latest: dict[str, float] = {}
        self.last_step: int | None = None
        #: how often a step was marked (log, heartbeat with a step): a failure save checks
        #: that the last optimizer step was followed by one
        self.num_step_marks = 0
        self._poster = poster
        self._enabled = poster is not None
        self._flush_interval = flush_interval
        self._max_pending = max_pending
        self._max_line_bytes = max_pending_line_bytes
        self._wake_at = min(batch_size, max_pending)
        self._lock = threading.Lock()
        self._points: deque[tuple[int, float, dict[str, float]]] = deque()
        self._lines: deque[str] = deque()
        self._num_dropped_points = 0
        self._num_dropped_lines = 0
        self._line_bytes = 0  # what the pending lines cost, about
        self._heartbeat_pending = False
        self._busy_pending = False
        self._finished_pending = False
        self._exit: dict[str, Any] | None = None
        self._samples: list[dict[str, Any]] = []
        self._checkpoints: list[dict[str, Any]] = []
        self._meter: ThroughputMeter | None = None  # made at the first log with tokens=
        #: the data-loading totals to send (`air_sdk.runtime.data.metrics`), once counted
        self._data_source: Callable[[bool], dict[str, Any] | None] | None = None
        self._data_retry: dict[str, Any] | None = None  # totals whose report failed
        self._num_enqueued = 0  # every item handed to the shipper, to tell flush() when it is done
        self._num_settled = 0
        self._settled = threading.Condition()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        if poster is not None:
            self._thread = threading.Thread(target=self._run, name="air-shipper", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    @property
    def enabled(self) -> bool:
        """False without a gateway, after close(), or once the gateway said stop (409/401/404)."""
        return self._enabled

    def log(self, step: int, **values: Any) -> None:
        """Record one point; cheap, never does I/O. Also this rank's heartbeat."""
        try:
            step = operator.index(step)
        except TypeError:
            raise TypeError(f"air.log(): step must be an int, not {type(step).__name__}") from None
        floats = _floats(values)
        now = 0.0
        if TOKENS in floats:  # one dict lookup for everyone else
            now = time.time()
            meter = self._meter
            if meter is None:
                meter = self._meter = meter_from_env()
            meter.add_to(floats, step, now)
        self.latest.update(floats)
        self.num_step_marks += 1
        if not self._enabled:
            self.last_step = step
            return
        item = (step, now or time.time(), floats)
        with self._lock:  # last_step too, so a report's heartbeat never runs ahead of its points
            self.last_step = step
            points = self._points
            if len(points) >= self._max_pending:
                points.popleft()
                self._num_dropped_points += 1
            points.append(item)
            self._num_enqueued += 1
            wake = len(points) == self._wake_at  # wake the thread on crossing, not every call
        if wake:
            self._wake.set()

    def heartbeat(self, step: int | None = None) -> None:
        """Mark progress without metrics; posted at most once per flush interval."""
        if step is not None:
            self.last_step = operator.index(step)
            self.num_step_marks += 1
        if not self._enabled:
            return
        with self._lock:
            self._heartbeat_pending = True
            self._num_enqueued += 1

    def mark_finished(self) -> None:
        """Note that this rank's runtime shut down: the next report says the rank is
        leaving, so the runner stops applying the hang timeout to it."""
        if not self._enabled:
            return
        with self._lock:
            self._finished_pending = True
            self._num_enqueued += 1

    def mark_busy(self) -> None:
        """Note that the rank used CPU or GPU since the last report (its NodeRunner's
        reading): not progress, but no hang of a script that never calls air.log."""
        if not self._enabled:
            return
        with self._lock:
            self._busy_pending = True
            self._num_enqueued += 1

    def add_line(self, line: str) -> None:
        """Queue one output line (the supervisor's use); truncated to the schema's limit."""
        if not self._enabled:
            return
        line = line[:MAX_LOG_LINE_CHARS]
        with self._lock:
            self._lines.append(line)
            self._line_bytes += len(line) + _LINE_OVERHEAD
            if self._line_bytes > self._max_line_bytes:
                self._trim_lines()
            self._num_enqueued += 1

    def add_samples(self, samples: list[dict[str, Any]]) -> None:
        """Queue device utilization samples (DeviceSample dicts) from the node's sampler.
        Only the newest few are kept: they describe now, not history worth buffering."""
        if not self._enabled or not samples:
            return
        with self._lock:
            self._samples = (self._samples + samples)[-_MAX_PENDING_SAMPLES:]
            self._num_enqueued += 1

    def add_checkpoint(self, record: Mapping[str, Any]) -> None:
        """Queue one checkpoint record (a CheckpointCommit or CheckpointSkip as a dict);
        it goes out with the next report and is kept if posting fails."""
        if not self._enabled:
            return
        with self._lock:
            self._checkpoints.append(dict(record))
            self._num_enqueued += 1
        self._wake.set()

    def set_data_source(self, take: Callable[[bool], dict[str, Any] | None]) -> None:
        """Send what `take(force)` returns (data-loading totals, or None: nothing new)
        with each report; the shipper calls it from its thread, `force` on the last."""
        self._data_source = take

    def report_exit(self, rank_exit: RankExit) -> None:
        """Queue the rank's exit; it goes out after every line queued before it."""
        if not self._enabled:
            return
        with self._lock:
            self._exit = rank_exit.model_dump(mode="json")
            self._num_enqueued += 1
        self._wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until everything queued so far was posted; False if `timeout` ran out."""
        thread = self._thread
        if not self._enabled or thread is None or not thread.is_alive():
            return True
        with self._lock:
            target = self._num_enqueued
        self._wake.set()
        with self._settled:
            return self._settled.wait_for(
                lambda: self._num_settled >= target or not self._enabled or not thread.is_alive(),
                timeout,
            )

    def close(self, timeout: float = 10.0) -> bool:
        """Flush and stop the thread (also run at exit); False if data was left unsent."""
        atexit.unregister(self.close)
        if self._meter is not None:
            self._meter.close()
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._enabled = False
            return True
        self._closing.set()
        self._wake.set()
        thread.join(timeout)
        if thread.is_alive() and self._poster is not None:
            self._poster.abort()
            thread.join(1.0)
        self._enabled = False
        return self._num_settled >= self._num_enqueued

    def _disable_after_fork(self) -> None:
        # A forked child has no shipper thread, and this object's lock may be held forever.
        self._enabled = False
        self._thread = None

    def _run(self) -> None:
        while True:
            self._wake.wait(self._flush_interval)
            self._wake.clear()
            closing = self._closing.is_set()  # read before shipping: covers all data before close()
            try:
                self._ship_pending(final=closing)
            except Exception as exc:  # the thread must outlive any surprise; training goes on
                warn(f"reporting failed unexpectedly ({exc!r}); retrying")
            aborted = self._poster is None or self._poster.aborted
            if not self._enabled or (
                closing and (self._num_settled >= self._num_enqueued or aborted)
            ):
                return

    def _ship_pending(self, *, final: bool = False) -> None:
        assert self._poster is not None
        take = self._data_source
        data = take(final) if take is not None else None
        if data is None:
            data, self._data_retry = self._data_retry, None
        with self._lock:
            points, self._points = self._points, deque()
            lines, self._lines = self._lines, deque()
            self._line_bytes = 0
            dropped, self._num_dropped_points = self._num_dropped_points, 0
            dropped_lines, self._num_dropped_lines = self._num_dropped_lines, 0
            heartbeat = self._heartbeat_pending
            self._heartbeat_pending = False
            busy, self._busy_pending = self._busy_pending, False
            finished, self._finished_pending = self._finished_pending, False
            rank_exit, self._exit = self._exit, None
            samples, self._samples = self._samples, []
            checkpoints, self._checkpoints = self._checkpoints, []
            taken = self._num_enqueued
            last_step = self.last_step
        if dropped_lines:
            lines.appendleft(f"[air] {dropped_lines} earlier output lines were dropped")
        if (
            points
            or lines
            or heartbeat
            or rank_exit
            or dropped
            or samples
            or checkpoints
            or busy
            or finished
            or data is not None
        ):
            batches = _split(list(points), list(lines))
            batches[0].dropped_points = dropped
            for batch in batches:
                batch.heartbeat_step = batch.points[-1][0] if batch.points else None
            if heartbeat or points:
                batches[-1].heartbeat_step = last_step
            batches[-1].exit = rank_exit
            batches[-1].samples = samples
            batches[-1].checkpoints = checkpoints
            batches[-1].busy = busy
            batches[-1].finished = finished
            batches[-1].data = data
            poster = self._poster
            for index, batch in enumerate(batches):
                if msgpack is not None and poster.takes_msgpack:
                    outcome = poster.post(
                        batch.to_msgpack(self.rank),
                        content_type=MSGPACK_TYPE,
                        as_json=functools.partial(batch.to_json, self.rank),
                    )
                else:
                    outcome = poster.post(batch.to_json(self.rank))
                if outcome is PostOutcome.FAILED:
                    self._requeue(batches[index:])
                    return
                if outcome is PostOutcome.STOPPED:
                    self._stop()
                    return
        with self._settled:
            self._num_settled = max(self._num_settled, taken)
            self._settled.notify_all()

    def _requeue(self, batches: list[_Batch]) -> None:
        """Put unsent data back in front of newer data, still within the bounds."""
        points = deque(p for batch in batches for p in batch.points)
        lines = deque(line for batch in batches for line in batch.lines)
        with self._lock:
            points.extend(self._points)
            lines.extend(self._lines)
            over_points = max(len(points) - self._max_pending, 0)
            for _ in range(over_points):
                points.popleft()
            self._points, self._lines = points, lines
            self._num_dropped_points += over_points + sum(b.dropped_points for b in batches)
            self._line_bytes = sum(map(len, lines)) + _LINE_OVERHEAD * len(lines)
            self._trim_lines()
            self._heartbeat_pending = True
            self._finished_pending = self._finished_pending or batches[-1].finished
            if self._exit is None:
                self._exit = batches[-1].exit
            self._checkpoints = batches[-1].checkpoints + self._checkpoints
        self._data_retry = batches[-1].data

    def _trim_lines(self) -> None:
        """Drop the oldest lines beyond the budget; call with the lock held."""
        lines = self._lines
        while self._line_bytes > self._max_line_bytes and lines:
            self._line_bytes -= len(lines.popleft()) + _LINE_OVERHEAD
            self._num_dropped_lines += 1

    def _stop(self) -> None:
        self._enabled = False
        with self._lock:
            self._points.clear()
            self._lines.clear()
            self._line_bytes = 0
            self._exit = None
            self._checkpoints.clear()
        with self._settled:
            self._settled.notify_all()


_global: MetricsShipper | None = None
_global_lock = threading.Lock()


def shipper_from_env(env: Mapping[str, str] | None = None, **options: Any) -> MetricsShipper:
    """A shipper for this rank as the launcher described it; posts nothing without a gateway.

    Example:
        >>> shipper_from_env({}).enabled
        False
    """
    ctx = context(env)
    poster = ReportPoster(report_url(ctx), job_token(env)) if ctx.has_gateway else None
    return MetricsShipper(ctx.rank, poster, **options)


def get_shipper() -> MetricsShipper:
    """The process-wide shipper behind `air.log()`, created from the env on first use.

    Example:
        >>> get_shipper() is get_shipper()
        True
    """
    global _global
    shipper = _global
    if shipper is None:
        with _global_lock:
            if _global is None:
                _global = shipper_from_env()
            shipper = _global
    return shipper


def _reset_after_fork() -> None:
    global _global, _global_lock
    if _global is not None:
        _global._disable_after_fork()
    _global = None
    _global_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


@contextlib.contextmanager
def keep_alive(interval_s: float = 0.5) -> Iterator[None]:
    """Heartbeats while the training thread waits on AIR (a checkpoint save or load,
    shutdown): that is work, and the runner's hang detection must never take it for
    a hang.

    Example:
        >>> with keep_alive():
        ...     pass
    """
    shipper = get_shipper()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval_s):
            shipper.heartbeat()

    ticker = threading.Thread(target=beat, name="air-ckpt-heartbeat", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
