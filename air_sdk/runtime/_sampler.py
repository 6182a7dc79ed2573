"""Device utilization of this node, sampled in the background and shipped with reports.

One sampler per node (the supervisor of local rank 0 runs it): GPUs through
nvidia-ml-py when this node has any, else the CPU and memory through psutil.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from air_sdk.runtime._shipper import MetricsShipper
from air_sdk.schema.worker_env import WorkerEnv

DEFAULT_INTERVAL_S = 2.0


class DeviceSampler:
    """Samples utilization every `interval_s` and hands it to the shipper.

    Example:
        >>> sampler = DeviceSampler("node-0", shipper)  # doctest: +SKIP
        >>> sampler.start()  # doctest: +SKIP
    """

    def __init__(
        self, node: str, shipper: MetricsShipper, interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        self.node = node
        self.shipper = shipper
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._gpus: list[tuple[int, Any]] = []

    def start(self) -> None:
        self._open_gpus()
        if not self._gpus:
            import psutil

            psutil.cpu_percent(None)  # the first reading is meaningless: prime it
        self._thread = threading.Thread(target=self._run, name="air-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 1)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def sample(self) -> list[dict[str, Any]]:
        """One reading of every device of this node (DeviceSample dicts)."""
        now = time.time()
        if self._gpus:
            return [self._gpu_sample(index, handle, now) for index, handle in self._gpus]
        import psutil

        mem = psutil.virtual_memory()
        return [
            {
                "node": self.node,
                "device": "cpu",
                "ts": now,
                "util_pct": psutil.cpu_percent(None),
                "mem_used_mib": (mem.total - mem.available) / 2**20,
                "mem_total_mib": mem.total / 2**20,
            }
        ]

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.shipper.add_samples(self.sample())
            except Exception:  # a flaky driver must never take the rank's reporting down
                continue

    def _open_gpus(self) -> None:
        visible = os.environ.get(WorkerEnv.env_name("cuda_visible_devices"))
        if visible is not None and not visible.strip():
            return  # a CPU job: the placement gave this node no GPU
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return  # no driver (NVMLError_LibraryNotFound) or no nvidia-ml-py
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        indices = (
            [int(i) for i in visible.split(",") if i.strip().isdigit()]
            if visible
            else list(range(count))
        )
        self._gpus = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices if i < count]

    def _gpu_sample(self, index: int, handle: Any, now: float) -> dict[str, Any]:
        nvml = self._nvml
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except Exception:
            power = None
        return {
            "node": self.node,
            "device": f"gpu{index}",
            "ts": now,
            "util_pct": float(util.gpu),
            "mem_used_mib": mem.used / 2**20,
            "mem_total_mib": mem.total / 2**20,
            "power_w": power,
        }
