"""`air.checkpoint.record`: tell AIR about a checkpoint that something else wrote.

Lightning, transformers' Trainer and accelerate write checkpoints of their own, and
resume from them. Recording one makes it an AIR checkpoint event, like a commit of
`air.checkpoint.save`: listed by `air checkpoints` and `Job.checkpoints()`, drawn in
the monitor, and counted by goodput (work up to a job's last checkpoint is kept
when a rank dies). AIR does not read, verify or delete these files; the library
that wrote them restores from them.
"""

from __future__ import annotations

import operator
import os
from typing import Any

from air_sdk.runtime._context import context

__all__ = ["measure", "record"]


def measure(path: str) -> tuple[int, int]:
    """(bytes, files) under a local file or directory; (0, 0) for a URL or a missing path.

    Example:
        >>> measure("/nonexistent/checkpoint")
        (0, 0)
    """
    if "://" in path:
        return 0, 0
    try:
        if os.path.isfile(path):
            return os.path.getsize(path), 1
        size = files = 0
        for root, _dirs, names in os.walk(path):
            for name in names:
                try:
                    size += os.path.getsize(os.path.join(root, name))
                    files += 1
                except OSError:  # removed while we looked (a library's retention)
                    continue
        return size, files
    except OSError:
        return 0, 0


def record(
    path: str | os.PathLike[str],
    *,
    step: int,
    seconds: float = 0.0,
    restored: bool = False,
    source: str | None = None,
) -> None:
    """Report a checkpoint written (or, with `restored=True`, resumed from) outside
    `air.checkpoint.save`; call it once per checkpoint, on one rank.

    `seconds` is how long writing it held up training. The size and file count are
    read from `path` (a file or a directory). Without an AIR gateway this does nothing.
    `source` names what wrote it (AIR's integrations pass "lightning",
    "transformers" or "accelerate").

    Example:
        >>> import air_sdk.runtime as air
        >>> air.checkpoint.record("/tmp/out/checkpoint-100", step=100, seconds=0.8)
        >>> air.checkpoint.record("/tmp/out/checkpoint-100", step=100, restored=True)
    """
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError(
            f"air.checkpoint.record(): step must be an int, not {type(step).__name__}"
        ) from None
    if step < 0:
        raise ValueError(f"air.checkpoint.record(): step must be >= 0, not {step}")
    where = os.fspath(path)
    if not where:
        raise ValueError("air.checkpoint.record(): path is empty; pass the checkpoint's path")
    from air_sdk.runtime._shipper import get_shipper

    shipper = get_shipper()
    if not shipper.enabled:
        return
    ctx = context()
    body: dict[str, Any] = {"step": step, "path": where, "attempt": ctx.attempt}
    if restored:
        body["restored"] = True
    else:
        size, num_files = measure(where)
        seconds = round(max(float(seconds), 0.0), 4)
        body.update(
            world_size=ctx.world_size,
            size_bytes=size,
            num_files=num_files,
            blocked_s=seconds,
            durable_s=seconds,
        )
    if source is not None:
        body["source"] = source
    shipper.add_checkpoint(body)
