"""Is a rank doing anything? Its CPU time and its GPUs, read by its NodeRunner.

A script that never calls `air.log` reports no steps, so its hangs are judged on what
the NodeRunner sees instead: its output lines, and whether the rank's process tree used
CPU (or its GPUs were busy) since the last look. Each watched rank costs one read of
/proc per process of its tree every `ACTIVITY_INTERVAL_S`, and one report to the
gateway per interval while it is busy (`MetricsShipper.mark_busy`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ACTIVITY_INTERVAL_S",
    "BUSY_CPU_FRACTION",
    "ActivityWatch",
    "CpuActivity",
    "process_tree_cpu_s",
    "visible_gpus",
]

#: seconds between two looks at a rank's CPU time
ACTIVITY_INTERVAL_S = 2.0
#: a rank whose processes used more than this share of one core between two looks is
#: busy: a process blocked in a collective or `signal.pause()` uses about none
BUSY_CPU_FRACTION = 0.05
#: a GPU above this utilization counts as busy
BUSY_GPU_PCT = 5.0


@dataclass
class CpuActivity:
    """Turns readings of a process tree's CPU seconds into "busy since the last look".

    Example:
        >>> cpu = CpuActivity()
        >>> cpu.busy(10.0, interval_s=2.0)  # the first reading only sets the baseline
        False
        >>> cpu.busy(10.01, interval_s=2.0), cpu.busy(11.0, interval_s=2.0)
        (False, True)
    """

    fraction: float = BUSY_CPU_FRACTION
    _last: float | None = field(default=None, init=False)

    def busy(self, cpu_s: float | None, *, interval_s: float) -> bool:
        if cpu_s is None:
            return False
        last, self._last = self._last, cpu_s
        # A child that ended takes its CPU time with it: a drop only resets the baseline.
        return last is not None and cpu_s - last > self.fraction * interval_s


def process_tree_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of `pid` and its descendants (and of the children
    they reaped); None when `pid` is gone.

    Example:
        >>> import os
        >>> process_tree_cpu_s(os.getpid()) > 0
        True
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class ActivityWatch:
    """Calls `on_busy()` every `interval_s` in which the rank `pid` used CPU, or one of
    the GPUs `gpus` (indices; empty for a CPU rank) was busy.

    A GPU waiting in an NCCL collective reads busy too: such hangs are caught by the
    collective's own timeout (`init_process_group(timeout=...)`), not by this watch.

    Example:
        >>> watch = ActivityWatch(rank_pid, shipper.mark_busy)  # doctest: +SKIP
        >>> watch.start(); ...; watch.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        pid: int,
        on_busy: Callable[[], None],
        *,
        gpus: Sequence[int] = (),
        interval_s: float = ACTIVITY_INTERVAL_S,
    ) -> None:
        self.pid = pid
        self.on_busy = on_busy
        self.gpus = list(gpus)
        self.interval_s = interval_s
        self._cpu = CpuActivity()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="air-activity", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.interval_s + 1)

    def look(self) -> bool:
        """One look: busy since the previous one?"""
        cpu = self._cpu.busy(process_tree_cpu_s(self.pid), interval_s=self.interval_s)
        return cpu or self._gpu_busy()

    def _run(self) -> None:
        self._open_gpus()
        self.look()  # the baseline
        while not self._stop.wait(self.interval_s):
            try:
                if self.look():
                    self.on_busy()
            except Exception:  # a flaky driver must never take the rank's reporting down
                continue
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def _open_gpus(self) -> None:
        if not self.gpus:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return
        self._nvml = pynvml

    def _gpu_busy(self) -> bool:
        if self._nvml is None:
            return False
        for index in self.gpus:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                if self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu > BUSY_GPU_PCT:
                    return True
            except Exception:
                continue
        return False


def visible_gpus(env: dict[str, str]) -> list[int]:
    """The GPU indices a rank's env gives it (`CUDA_VISIBLE_DEVICES`); none when unset
    or empty.

    Example:
        >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "0,2"}), visible_gpus({})
        ([0, 2], [])
    """
    from air_sdk.schema.worker_env import WorkerEnv

    raw = env.get(WorkerEnv.env_name("cuda_visible_devices"), "")
    return [int(i) for i in raw.split(",") if i.strip().isdigit()]
