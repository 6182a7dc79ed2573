"""The runner: turns queued jobs into placements and keeps one controller per job.

One scheduling thread asks the (pure) scheduler which queued jobs start now
and starts a controller thread for each; a controller's placement is held until
its job ends. The runner reads and writes only the store, never HTTP.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from air_sdk.runner.backends.base import Backend
from air_sdk.runner.backends.local import job_processes
from air_sdk.runner.controller import JobController, JobPaths
from air_sdk.scheduler import JobRequest, fits_ever, schedule_fifo
from air_sdk.schema import FailureInfo, JobSpec, JobState
from air_sdk.store import SqliteStore
from air_sdk.store.sqlite import ACTIVE_STATES

log = logging.getLogger(__name__)


def job_request(job_id: str, spec: JobSpec) -> JobRequest:
    r = spec.resources
    return JobRequest(
        job_id=job_id,
        nodes=r.nodes,
        slots_per_node=r.ranks_per_node,
        gpus_per_node=r.gpus_per_node,
        pool=spec.pool,
    )


class Runner:
    """Schedules queued jobs onto the backend's inventory and runs their controllers.

    Example:
        >>> runner = Runner(store, LocalBackend(2), home, "http://127.0.0.1:8470")  # doctest: +SKIP
        >>> runner.start()  # doctest: +SKIP
    """

    def __init__(
        self,
        store: SqliteStore,
        backend: Backend,
        home: Path,
        gateway_url: str,
        *,
        tick_s: float = 0.1,
    ) -> None:
        self.store = store
        self.backend = backend
        self.home = home
        self.gateway_url = gateway_url
        self.tick_s = tick_s
        self._controllers: dict[str, JobController] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._recover()
        self._thread = threading.Thread(target=self._loop, name="air-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop scheduling, then stop every active job's processes and fail the job with
        a reason that says so (re-attaching after a restart comes with resilience)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            threads = list(self._threads.values())
            controllers = list(self._controllers.values())
        for t in threads:
            t.join(timeout_s)
        for ctl in controllers:
            if not ctl.done:
                ctl.abort("the gateway was stopped while the job ran; resubmit it")

    def wake(self) -> None:
        """Schedule now (called after a submit or cancel) instead of at the next tick."""
        self._wake.set()

    def allocations(self) -> dict[str, list[str]]:
        """Node name -> ids of the jobs holding slots on it."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for ctl in self._controllers.values():
                for a in ctl.placement.nodes:
                    out.setdefault(a.node, []).append(ctl.job_id)
        return out

    def held_placements(self) -> list:
        with self._lock:
            return [c.placement for c in self._controllers.values()]

    # -- loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.schedule_once()
            except Exception:  # the loop must outlive any one bad cycle
                log.exception("scheduling cycle failed")
            self._wake.wait(self.tick_s)
            self._wake.clear()

    def schedule_once(self) -> list[str]:
        """One scheduling cycle; returns the ids of the jobs it started."""
        with self._lock:
            for job_id in [j for j, t in self._threads.items() if not t.is_alive()]:
                del self._threads[job_id]
                del self._controllers[job_id]
        queued = self.store.list_jobs(states=(JobState.QUEUED,), oldest_first=True, limit=10_000)
        inventory = self.backend.inventory()
        requests = []
        for job in queued:
            req = job_request(job.id, job.spec)
            never = fits_ever(req, inventory)
            if never is not None:
                self.store.transition(
                    job.id,
                    JobState.FAILED,
                    never,
                    failure=FailureInfo(attempt=0, reason=never),
                    expect=(JobState.QUEUED,),
                )
                continue
            requests.append(req)
        placements = schedule_fifo(requests, inventory, self.held_placements())
        started = []
        for placement in placements:
            scheduled = self.store.transition(
                placement.job_id,
                JobState.SCHEDULED,
                "placed on " + ", ".join(a.node for a in placement.nodes),
                expect=(JobState.QUEUED,),
            )
            if scheduled is None:
                continue  # cancelled meanwhile
            ctl = JobController(
                self.store,
                self.backend,
                scheduled,
                placement,
                JobPaths(self.home / "jobs" / scheduled.id),
                self.gateway_url,
            )
            thread = threading.Thread(
                target=self._run_controller,
                args=(ctl,),
                name=f"air-job-{scheduled.id}",
                daemon=True,
            )
            with self._lock:
                self._controllers[scheduled.id] = ctl
                self._threads[scheduled.id] = thread
            thread.start()
            started.append(scheduled.id)
        return started

    def _run_controller(self, ctl: JobController) -> None:
        try:
            while not ctl.done and not self._stop.is_set():
                ctl.step()
                if not ctl.done:
                    time.sleep(self.tick_s)
        except Exception as exc:
            log.exception("controller of %s crashed", ctl.job_id)
            try:
                ctl.abort(f"internal error in the runner: {exc}")
            except Exception:
                log.exception("could not fail %s", ctl.job_id)
        finally:
            self._wake.set()  # its slots are free: schedule now

    def _recover(self) -> None:
        """Jobs a previous gateway left active: their controllers are gone with it.
        Re-attaching comes with the resilience work; until then stop their leftovers
        and fail them with a reason that says what happened."""
        for job in self.store.list_jobs(states=ACTIVE_STATES, limit=10_000):
            for pid in job_processes(job.id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            reason = "the gateway restarted while the job was active; resubmit it"
            self.store.transition(
                job.id,
                JobState.FAILED,
                reason,
                failure=FailureInfo(attempt=job.attempt, reason=reason),
            )
