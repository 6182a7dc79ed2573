"""ExportService: the gateway's threads that forward exporting jobs' events to trackers.

For each job whose spec names trackers (`JobSpec.export`) and each tracker, a thread of
its own starts a worker process (`air_sdk.export.worker`), feeds it the job's `metrics`
and `checkpoint` events in order, and, once the job has ended and everything is
written, its final state. Each tracker of a job has its own thread, worker, position
and outcome, so a tracker that is slow or hangs (an MLflow server that never answers)
delays no other: the job's TensorBoard files are complete while its MLflow export
still waits. One dispatching thread starts those threads for the jobs it follows. Its position (the last event seq the worker confirmed), the run to write on
into, and the outcome are kept in `<exports>/<job>/<tracker>/state.json`: a gateway
that restarts carries on from there (a batch written but not yet confirmed when the
gateway died is written again: MLflow and TensorBoard then hold that batch twice, at
the same steps).

Every change the user should see is an `export` event on the job (`ExportStatus`):
`running` with where the data goes, `done`, or `failed` with the worker's error after
`MAX_FAILURES` tries.

Example:
    >>> from air_sdk.schema import JobSpec
    >>> ExportService.refusal_for(JobSpec(entrypoint="t.py", export=["mlflow=http://m:5000"]), ())
    "--export mlflow=http://m:5000: this gateway's operator allows no MLflow tracking server (air gateway start --export-uri PREFIX); leave the URI out and the gateway keeps a SQLite store for the job"
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from air_sdk.schema import EventType, ExportStatus, ExportTarget, JobRecord, JobSpec, JobState
from air_sdk.store import SqliteStore

__all__ = ["ExportService"]

log = logging.getLogger(__name__)

#: tries of one job's export to one tracker before it is reported failed
MAX_FAILURES = 3
#: how long the service waits for a worker's answer (an import of mlflow or wandb on a
#: loaded machine takes 5-15 s; a tracking server may be slow)
ANSWER_TIMEOUT_S = 180.0
#: events sent to a worker at once
BATCH_EVENTS = 500
#: the job's env variables a tracker's worker gets, by name prefix (its login: MLflow's
#: MLFLOW_TRACKING_TOKEN / _USERNAME / ..., W&B's key and entity); nothing else of the
#: job's env reaches the worker
TRACKER_ENV: dict[str, tuple[str, ...]] = {
    "mlflow": ("MLFLOW_TRACKING_",),
    "wandb": ("WANDB_API_KEY", "WANDB_ENTITY"),
    "tensorboard": (),
}
#: never from a job: where the worker sends data is the gateway's choice
NOT_FROM_JOB = frozenset({"MLFLOW_TRACKING_URI"})
#: the module each tracker's writer imports
LIBRARIES = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard"}
#: the gateway's own env variables every worker gets (an operator's W&B server is the
#: gateway's setting, never a job's: a job-chosen URL would make the gateway call it)
GATEWAY_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "WANDB_BASE_URL", "SSL_CERT_FILE", "TMPDIR")


class ExportError(Exception):
    """One try of an export failed; the text says why."""


@dataclass
class _State:
    seq: int = 0
    state: str = "new"  # new | running | done | failed
    location: str = ""
    error: str = ""
    failures: int = 0
    resume: dict[str, str] = field(default_factory=dict)
    retry_at: float = 0.0


class _Worker:
    """One worker process and its answers, one JSON line each."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, stderr: IO[bytes]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        self._buffer = b""

    def ask(self, message: str, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(message.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ExportError(f"the export worker exited (code {self.proc.wait()})") from None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise ExportError(f"the export worker did not answer in {timeout_s:.0f} s")
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise ExportError(f"the export worker exited (code {self.proc.wait()})")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ExportError(str(answer["error"]))
        return answer

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class ExportService:
    """Follows exporting jobs and feeds their trackers (see the module docstring).

    `allowed_uris`: the MLflow tracking servers jobs may name (URI prefixes the
    operator sets with `air gateway start --export-uri`); none by default, so that no
    job makes the gateway call a server of its choosing."""

    def __init__(
        self,
        store: SqliteStore,
        root: Path,
        *,
        allowed_uris: Sequence[str] = (),
        poll_s: float = 1.0,
        retry_s: float = 5.0,
    ) -> None:
        self.store = store
        self.retry_s = retry_s
        self.root = root
        self.allowed_uris = tuple(allowed_uris)
        self.poll_s = poll_s
        self._active: set[str] = set()
        self._workers: dict[tuple[str, str], _Worker] = {}
        #: (job, tracker) -> the thread that exports it
        self._followers: dict[tuple[str, str], threading.Thread] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the gateway calls ---------------------------------------------------------

    @staticmethod
    def refusal_for(spec: JobSpec, allowed_uris: Sequence[str]) -> str | None:
        """Why this gateway cannot export `spec` as asked, or None."""
        for target in spec.export:
            module = LIBRARIES[target.to]
            if importlib.util.find_spec(module) is None:
                return (
                    f"--export {target.to}: this gateway has no {module} installed; its"
                    " operator installs it with `pip install 'air-runtime[export]'`"
                )
            dest = target.dest
            if target.to != "mlflow" or dest is None:
                continue
            if not any(dest.startswith(prefix) for prefix in allowed_uris):
                allowed = (
                    f"it allows {', '.join(allowed_uris)}"
                    if allowed_uris
                    else "this gateway's operator allows no MLflow tracking server"
                    " (air gateway start --export-uri PREFIX)"
                )
                return (
                    f"--export mlflow={dest}: {allowed}; leave the URI out and the gateway"
                    " keeps a SQLite store for the job"
                )
        return None

    def refusal(self, spec: JobSpec) -> str | None:
        return self.refusal_for(spec, self.allowed_uris)

    def watch(self, job_id: str) -> None:
        """Start following `job_id` (a new job whose spec exports)."""
        with self._lock:
            self._active.add(job_id)
        self._wake.set()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for job_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            states = [self._load(job_dir.name, t.name) for t in job_dir.iterdir() if t.is_dir()]
            if any(s.state not in ("done", "failed") for s in states):
                self._active.add(job_dir.name)  # unfinished when the gateway stopped
        active = tuple(s for s in JobState if not s.terminal)
        for job in self.store.list_jobs(states=active, limit=10_000):
            if job.spec.export:
                self._active.add(job.id)  # submitted while exports had not started yet
        self._thread = threading.Thread(target=self._run, name="air-export", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following: the workers are killed (a worker waiting on a tracker that
        never answers included), and every export carries on from its position when a
        gateway starts again."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            workers, self._workers = list(self._workers.values()), {}
            followers = list(self._followers.values())
        for worker in workers:
            worker.stop()
        for follower in followers:
            follower.join(timeout=30)

    # -- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        """The dispatcher: a thread for each tracker of each followed job that has not
        finished; a job is dropped once all of its trackers finished."""
        while not self._stopping.is_set():
            with self._lock:
                active = sorted(self._active)
            for job_id in active:
                try:
                    if self._dispatch(job_id):
                        with self._lock:
                            self._active.discard(job_id)
                except Exception:  # one job's trouble never stops the others' exports
                    log.exception("export of job %s", job_id)
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def _dispatch(self, job_id: str) -> bool:
        """Start a thread for each tracker of `job_id` that has none and has not
        finished; True when all of them are finished."""
        job = self.store.get_job(job_id)
        if job is None:
            return True
        finished = True
        for target in job.spec.export:
            key = (job_id, target.to)
            with self._lock:
                follower = self._followers.get(key)
            if follower is not None and follower.is_alive():
                finished = False
                continue
            if self._load(job_id, target.to).state in ("done", "failed"):
                continue
            finished = False
            follower = threading.Thread(
                target=self._follow,
                args=(job_id, target),
                name=f"air-export-{job_id}-{target.to}",
                daemon=True,
            )
            with self._lock:
                if self._stopping.is_set():
                    break
                self._followers[key] = follower
            follower.start()
        return finished

    def _follow(self, job_id: str, target: ExportTarget) -> None:
        """One job's export to one tracker, on its own thread, until it is done or failed
        (or the service stops)."""
        state = self._load(job_id, target.to)
        while not self._stopping.is_set() and state.state not in ("done", "failed"):
            if time.time() >= state.retry_at:
                job = self.store.get_job(job_id)
                if job is None:
                    return
                try:
                    self._advance(job, target, state)
                except ExportError as exc:
                    if self._stopping.is_set():
                        return  # the gateway stops: not the tracker's failure
                    self._failed(job, target, state, str(exc))
                except Exception:  # tried again at the next poll
                    log.exception("export of job %s to %s", job_id, target.to)
            if state.state in ("done", "failed"):
                return
            retry_in = state.retry_at - time.time()
            self._stopping.wait(retry_in if 0 < retry_in < self.poll_s else self.poll_s)

    def _advance(self, job: JobRecord, target: ExportTarget, state: _State) -> None:
        key = (job.id, target.to)
        with self._lock:
            worker = self._workers.get(key)
        worker = worker or self._start(job, target, state)
        while not self._stopping.is_set():
            events = self.store.read_events(
                job.id,
                after=state.seq,
                limit=BATCH_EVENTS,
                types=(EventType.METRICS, EventType.CHECKPOINT),
            )
            if not events:
                break
            body = ",".join(e.model_dump_json() for e in events)
            answer = worker.ask('{"events": [' + body + "]}", ANSWER_TIMEOUT_S)
            state.seq = int(answer["seq"])
            self._save(job.id, target.to, state)
        current = self.store.get_job(job.id)
        if current is None or not current.state.terminal or self._stopping.is_set():
            return
        if self.store.read_events(
            job.id, after=state.seq, limit=1, types=(EventType.METRICS, EventType.CHECKPOINT)
        ):
            return  # events came after the read above: the next round sends them
        end = {"end": {"state": current.state.value, "reason": current.state_reason}}
        worker.ask(json.dumps(end), ANSWER_TIMEOUT_S)
        self._drop_worker(key)
        state.state = "done"
        self._save(job.id, target.to, state)
        self.store.append_event(
            job.id, ExportStatus(to=target.to, state="done", location=state.location)
        )

    def _start(self, job: JobRecord, target: ExportTarget, state: _State) -> _Worker:
        directory = self._dir(job.id, target.to)
        env = {k: os.environ[k] for k in GATEWAY_ENV if k in os.environ}
        env |= {
            k: v
            for k, v in job.spec.env.items()
            if k.startswith(TRACKER_ENV[target.to]) and k not in NOT_FROM_JOB
        }
        env |= {"HOME": str(directory), "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
        with open(directory / "worker.log", "ab") as stderr:
            worker = _Worker(
                [sys.executable, "-I", "-m", "air_sdk.export.worker"], env, directory, stderr
            )
        with self._lock:
            if self._stopping.is_set():  # stop() has taken the workers it kills already
                worker.stop()
                raise ExportError("the gateway is stopping")
            self._workers[(job.id, target.to)] = worker
        start = {
            "to": target.to,
            "dest": target.dest,
            "dir": str(directory),
            "resume": state.resume,
            "job": {
                "job_id": job.id,
                "name": job.name,
                "tenant": job.tenant,
                "params": _params(job.spec),
            },
        }
        try:
            answer = worker.ask(json.dumps({"start": start}), ANSWER_TIMEOUT_S)
        except ExportError:
            self._drop_worker((job.id, target.to))
            raise
        started = answer["started"]
        first = state.state == "new"
        state.state, state.location, state.resume = (
            "running",
            started["location"],
            started["resume"],
        )
        self._save(job.id, target.to, state)
        if first:
            self.store.append_event(
                job.id, ExportStatus(to=target.to, state="running", location=state.location)
            )
        return worker

    def _failed(self, job: JobRecord, target: ExportTarget, state: _State, why: str) -> None:
        self._drop_worker((job.id, target.to))
        state.failures += 1
        state.error = why
        if state.failures >= MAX_FAILURES:
            state.state = "failed"
            self.store.append_event(
                job.id,
                ExportStatus(
                    to=target.to,
                    state="failed",
                    location=state.location,
                    error=f"{why} (after {state.failures} tries; the worker's log:"
                    f" {self._dir(job.id, target.to) / 'worker.log'})",
                ),
            )
        else:
            state.retry_at = time.time() + self.retry_s * state.failures
        self._save(job.id, target.to, state)

    def _drop_worker(self, key: tuple[str, str]) -> None:
        with self._lock:
            worker = self._workers.pop(key, None)
        if worker is not None:
            worker.stop()

    # -- state on disk (the gateway's own directory: no job writes there) ---------------

    def _dir(self, job_id: str, to: str) -> Path:
        directory = self.root / job_id / to
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _load(self, job_id: str, to: str) -> _State:
        try:
            data = json.loads((self.root / job_id / to / "state.json").read_text())
        except FileNotFoundError:
            return _State()
        return _State(**data)

    def _save(self, job_id: str, to: str, state: _State) -> None:
        path = self._dir(job_id, to) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state)))
        os.replace(tmp, path)


def _params(spec: JobSpec) -> dict[str, str]:
    """What a tracker's run records as parameters: the job's shape."""
    params = {
        "nodes": str(spec.resources.nodes),
        "procs_per_node": str(spec.resources.procs_per_node),
        "gpus_per_node": str(spec.resources.gpus_per_node),
        "max_restarts": str(spec.max_restarts),
    }
    for name, size in spec.parallelism.model_dump().items():
        if isinstance(size, int) and size != 1:
            params[f"parallelism.{name}"] = str(size)
    return params
