"""A rank's line to the gateway from its NodeRunner: the rank's output lines, its
heartbeats and exit (the shipper), the node's device samples (local rank 0), and
the watch on its CPU/GPU use (`activity.py`).

It loads requests and pydantic only in `start()`, after the ranks were started.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["FINAL_FLUSH_S", "RankReporter"]

#: how long a rank's last reports (its exit among them) may take to post
FINAL_FLUSH_S = 5.0


class RankReporter:
    """A rank's line to the gateway: its shipper (logs, heartbeats, exit), and the node's
    device sampler on local rank 0, and the watch on its CPU/GPU use that keeps a script
    without air.log from being judged hung while it works (`activity.py`). Lines that
    come before the shipper exists (it loads requests and pydantic first) wait here."""

    def __init__(self, env: dict[str, str], node: str, samples: bool, pid: int = 0) -> None:
        self._env = env
        self._node = node
        self._samples = samples
        self._pid = pid
        self._watch: Any = None
        self._lock = threading.Lock()
        self._early: list[str] = []
        self._shipper: Any = None
        self._sampler: Any = None
        self._ready = threading.Event()

    def start(self) -> None:
        try:
            from air_sdk.runtime._shipper import shipper_from_env

            shipper = shipper_from_env(self._env, flush_interval=0.25)
            shipper.heartbeat()  # the rank is up: the runner marks the job RUNNING once all are
            from air_sdk.runtime.supervise import sample_interval_s

            interval = sample_interval_s(self._env)
            if self._samples and shipper.enabled and interval:  # one sampler per node
                from air_sdk.runtime._sampler import DeviceSampler

                self._sampler = DeviceSampler(self._node, shipper, interval_s=interval)
                self._sampler.start()
            if self._pid and shipper.enabled:
                from air_sdk.runner.node.activity import ActivityWatch, visible_gpus

                self._watch = ActivityWatch(
                    self._pid, shipper.mark_busy, gpus=visible_gpus(self._env)
                )
                self._watch.start()
            with self._lock:
                for line in self._early:
                    shipper.add_line(line)
                self._early = []
                self._shipper = shipper
        finally:
            self._ready.set()

    def add_line(self, line: str) -> None:
        with self._lock:
            if self._shipper is None:
                self._early.append(line)
                return
        self._shipper.add_line(line)

    def finish(self, ended: Any) -> None:
        self._ready.wait(60)
        if self._watch is not None:
            self._watch.stop()
        if self._sampler is not None:
            self._sampler.stop()
        if self._shipper is not None:
            self._shipper.report_exit(ended)
            self._shipper.close(timeout=FINAL_FLUSH_S)
