"""The public functions of `air_sdk.runtime` (re-exported lazily by its __init__)."""

from __future__ import annotations

from typing import Any

from air_sdk.runtime._context import context
from air_sdk.runtime._dist import init, shutdown
from air_sdk.runtime._shipper import get_shipper

__all__ = ["flush", "heartbeat", "init", "is_main", "log", "shutdown"]


def log(step: int, **values: Any) -> None:
    """Record metrics for `step`; never blocks on I/O. Each call is also a heartbeat.

    Values may be Python numbers, numpy scalars or one-element tensors (a CUDA
    tensor costs a device sync: log every few steps, or pass `.item()` you
    already have). A non-numeric value raises TypeError naming its key.

    `tokens=N` (the tokens in this rank's batch per step) turns on throughput: from
    the next log on, the point also carries `tokens_per_s` for the whole job and,
    on a GPU AIR knows (or with `AIR_PEAK_FLOPS`), `mfu`, with the FLOPs per step
    counted once by torch's FlopCounterMode over the first logged interval (or
    taken from `JobSpec.model`). See `air_sdk.runtime._throughput`.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.log(step=1, loss=0.25, lr=3e-4)
        >>> air.log(step=2, loss=0.24, tokens=8 * 1024)
    """
    get_shipper().log(step, **values)


def heartbeat(step: int | None = None) -> None:
    """Mark progress without metrics (e.g. in a long evaluation loop).

    Example:
        >>> import air_sdk.runtime as air
        >>> air.heartbeat(step=100)
    """
    get_shipper().heartbeat(step)


def flush(timeout: float = 10.0) -> bool:
    """Wait until everything logged so far reached the gateway; False if `timeout` ran out.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.flush(timeout=5)
        True
    """
    return get_shipper().flush(timeout)


def is_main() -> bool:
    """True on global rank 0.

    Example:
        >>> import air_sdk.runtime as air
        >>> if air.is_main():
        ...     print("saving the summary once")
        saving the summary once
    """
    return context().rank == 0
