"""Running an `@air_sdk.distributed` function on a rank, and sending back how it ended.

The bootstrap of a call (`air_sdk.notebook.bootstrap`) loads the function and its
arguments and calls `run_function` on every rank. Then:

- when the function returns, rank 0 pickles the value (cloudpickle, at most
  `MAX_RESULT_BYTES`) and posts it to the gateway in a `WorkerReport.result`,
  the way metrics travel, so it works on every backend (local, Ray) that can
  reach `AIR_GATEWAY_URL`; the other ranks' values are dropped, as Ray Train
  and torchrun users expect. A value that cannot be pickled, is too large, or
  does not reach the gateway fails the rank with a message that says what to
  return instead, so the caller never waits for a value that cannot come;
- when the function raises, the rank prints the traceback from the function's
  own frame down, posts the exception's type, message and traceback, and exits
  with status 1: the job fails (or restarts, under `max_restarts`) and the
  caller's `JobFailedError` carries that traceback.

Outside AIR (no `AIR_GATEWAY_URL`), nothing is posted.

Example:
    >>> sent = []
    >>> run_function(lambda x: x * 2, [21], {}, post=lambda result: sent.append(result) or True)
    >>> import base64, pickle
    >>> pickle.loads(base64.b64decode(sent[0].value_b64))
    42
"""

from __future__ import annotations

import base64
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import cloudpickle

from air_sdk.runtime._context import Context, context, job_token
from air_sdk.runtime._poster import PostOutcome, ReportPoster, report_url
from air_sdk.schema.events import (
    MAX_LOG_LINE_CHARS,
    MAX_RESULT_BYTES,
    MAX_TRACEBACK_CHARS,
    FunctionResult,
    WorkerReport,
)

__all__ = ["run_function"]

#: how long rank 0 keeps trying to deliver its return value
RESULT_POST_TIMEOUT_S = 60.0

_Post = Callable[[FunctionResult], object]


def run_function(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    post: _Post | None = None,
) -> None:
    """Call `fn(*args, **kwargs)` on this rank and report how it ended (see above).

    `post` sends one result and returns True when it arrived (default: to the
    gateway of `AIR_GATEWAY_URL`). Raises `SystemExit(1)` when the function
    raised or rank 0's value cannot be sent; the reason is printed to stderr first.

    Example:
        >>> run_function(print, ["hello from every rank"], {}, post=lambda result: True)
        hello from every rank
    """
    ctx = context()
    send = post if post is not None else _gateway_post(ctx)
    title = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        # From the function's own frame down: this module's frame is noise to the user.
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        print(text, end="", file=sys.stderr, flush=True)
        send(
            FunctionResult(
                ok=False,
                error_type=_class_name(type(exc)),
                error=str(exc)[:MAX_LOG_LINE_CHARS],
                traceback=text[-MAX_TRACEBACK_CHARS:],
            )
        )
        raise SystemExit(1) from None
    if ctx.rank != 0:
        return
    try:
        payload = _pickled(value)
    except _TooLarge:
        _fail(
            send,
            "ResultTooLargeError",
            f"the return value of {title}() ({_class_name(type(value))}) pickles to over"
            f" {MAX_RESULT_BYTES >> 20} MiB, the limit: save large results (a model's"
            " weights, a dataset) with air.checkpoint.save or to shared storage and return"
            " their path",
        )
    except Exception as exc:
        _fail(
            send,
            "ResultPickleError",
            f"the return value of {title}() ({_class_name(type(value))}) cannot be pickled"
            f" ({exc}): return plain data (numbers, strings, lists, dicts, tensors on the CPU)",
        )
    result = FunctionResult(
        ok=True, value_b64=base64.b64encode(payload).decode("ascii"), size_bytes=len(payload)
    )
    if not send(result):
        print(
            f"air: the return value of {title}() did not reach the gateway"
            f" ({ctx.gateway_url}); failing this rank so the caller does not wait for it",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)


class _TooLarge(Exception):
    pass


class _BoundedFile:
    def __init__(self, limit: int) -> None:
        self.data = bytearray()
        self.limit = limit

    def write(self, chunk: bytes | memoryview) -> int:
        size = memoryview(chunk).nbytes
        if len(self.data) + size > self.limit:
            raise _TooLarge
        self.data += chunk
        return size


def _pickled(value: Any) -> bytes:
    file = _BoundedFile(MAX_RESULT_BYTES)
    cloudpickle.Pickler(file, protocol=5).dump(value)
    return bytes(file.data)


def _fail(send: _Post, error_type: str, message: str) -> NoReturn:
    print(f"air: {message}", file=sys.stderr, flush=True)
    send(FunctionResult(ok=False, error_type=error_type, error=message[:MAX_LOG_LINE_CHARS]))
    raise SystemExit(1)


def _class_name(cls: type) -> str:
    module = cls.__module__
    name = cls.__qualname__
    return name if module in ("builtins", "__main__") else f"{module}.{name}"


def _gateway_post(ctx: Context) -> _Post:
    if not ctx.has_gateway:
        return lambda result: True  # a run by hand: there is no caller to answer

    def post(result: FunctionResult) -> bool:
        poster = ReportPoster(report_url(ctx), job_token(), max_post_s=RESULT_POST_TIMEOUT_S)
        body = WorkerReport(rank=ctx.rank, result=result).model_dump_json().encode()
        return poster.post(body) is PostOutcome.DELIVERED

    return post
