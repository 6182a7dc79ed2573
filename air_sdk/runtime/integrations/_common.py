"""What the integrations share: rank-0 metrics, per-rank progress, checkpoint records,
and never letting AIR's bookkeeping break a training run."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from air_sdk.runtime._context import context
from air_sdk.runtime._external_checkpoint import record
from air_sdk.runtime._shipper import get_shipper

__all__ = ["is_global_zero", "log_scalars", "quiet", "record_checkpoint", "step_done", "to_floats"]

F = TypeVar("F", bound=Callable[..., Any])
_warned: set[str] = set()
_rank: int | None = None


def is_global_zero() -> bool:
    """True on the job's global rank 0 (read once from the env contract)."""
    global _rank
    if _rank is None:
        _rank = context().rank
    return _rank == 0


def to_floats(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of a library's log dict; strings and other values are left
    out, nested dicts flattened to "outer/inner".

    Example:
        >>> to_floats({"loss": 0.5, "note": "warmup", "eval": {"acc": 1}})
        {'loss': 0.5, 'eval/acc': 1.0}
    """
    out: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, float | int):  # the common case, bool included
            out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(to_floats(value, f"{name}/"))
        elif not isinstance(value, str | bytes):
            try:  # numpy scalars, one-element tensors
                out[name] = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue
    return out


def log_scalars(step: int, values: Mapping[str, Any]) -> None:
    """`air.log` the numeric values of one library log call (call on rank 0 only)."""
    floats = to_floats(values)
    if floats:
        get_shipper().log(int(step), **floats)


def step_done(step: int | None) -> None:
    """Heartbeat one finished training step on this rank: hang detection and the
    job's progress. A rank that logs metrics already marks its steps with them, so
    for it a step only keeps the heartbeat alive, never a second step count."""
    shipper = get_shipper()
    shipper.heartbeat(None if step is None or shipper.latest else step)


def record_checkpoint(
    source: str, path: str, step: int, seconds: float = 0.0, *, restored: bool = False
) -> None:
    """Record a library's checkpoint (or a resume from it) as an AIR checkpoint event."""
    if math.isfinite(seconds):
        record(path, step=max(int(step), 0), seconds=seconds, restored=restored, source=source)


def quiet(what: str) -> Callable[[F], F]:
    """Decorate a hook so that an error in it is reported once on stderr and swallowed:
    AIR's view of a run must never stop the run."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def safe(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if what not in _warned:
                    _warned.add(what)
                    print(f"air: autolog ({what}) failed: {exc!r}", file=sys.stderr, flush=True)
                return None

        return safe  # type: ignore[return-value]

    return decorate
