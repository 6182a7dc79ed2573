"""The backend seam: how an attempt's nodes are started, watched and stopped.

A backend knows where NodeRunners live (`air_sdk.runner.node`: a process per job
and virtual node locally, one inside each node actor on Ray); it knows nothing of
job states, restarts or the store. The controller asks it to `launch`, `poll` and
`terminate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from air_sdk.scheduler import NodeSpec
from air_sdk.schema import JobSpec, Placement, RankExit, WorkerEnv


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a backend needs to start one attempt of a job."""

    job_id: str
    attempt: int
    spec: JobSpec
    placement: Placement
    #: unpacked job code; the working directory of every rank
    code_dir: Path
    #: per-attempt scratch: node logs and records, rank exit records
    attempt_dir: Path
    #: the entrypoint, relative to code_dir, or "-m MODULE" (`runner.node.launch.program_argv` splits it)
    entrypoint: str
    #: the env contract every rank of the attempt shares (AIR_JOB_ID, AIR_ATTEMPT,
    #: AIR_JOB_TOKEN, ...); the backend adds each node's and rank's part
    worker: WorkerEnv = field(default_factory=WorkerEnv)
    #: the job's tenant (where it may name its own directories: `runner.job_paths`)
    tenant: str = "default"

    @property
    def env(self) -> dict[str, str]:
        """`worker` as variables."""
        return self.worker.to_env()


@dataclass(frozen=True)
class NodeStatus:
    """One node of an attempt: still running (exit_code None) or exited."""

    node: str
    exit_code: int | None
    #: short human description when the node ended abnormally
    detail: str = ""
    #: the machine itself went away (a Ray node that left the cluster), so its ranks
    #: could report nothing; failures of ranks elsewhere are then its consequences
    lost: bool = False
    #: the exit records of the node's ranks when it ended, from a backend whose nodes
    #: keep them where the runner cannot read them (Ray): the ranks' reports of their
    #: exits may reach the gateway only after the node's own verdict
    rank_exits: tuple[RankExit, ...] = ()

    @property
    def running(self) -> bool:
        return self.exit_code is None


#: what `launch` returns and the other methods take back; each backend has its own
AttemptHandle = Any


class Backend(Protocol):
    """Starts and stops the processes of one attempt. Implementations: local, ray."""

    name: str

    def inventory(self) -> list[NodeSpec]:
        """The nodes this backend can place jobs on."""
        ...

    def launch(self, request: LaunchRequest) -> AttemptHandle:
        """Start every node of the placement; return at once."""
        ...

    def poll(self, handle: AttemptHandle) -> list[NodeStatus]:
        """Current status of each node; never blocks."""
        ...

    def terminate(
        self, handle: AttemptHandle, grace_s: float, *, wait_first_s: float = 0.0
    ) -> None:
        """Stop every process of the attempt: wait up to `wait_first_s` for it to end on
        its own, then SIGTERM, then SIGKILL after `grace_s`. Returns when nothing of the
        attempt is left."""
        ...

    def failure_marks(self, handle: AttemptHandle) -> set[str]:
        """The names of the files ranks left under `$AIR_ATTEMPT_DIR/failure-saves/` on
        every node (`armed-rank-R`, `rank-R`, `done-rank-R`: see
        `air_sdk.runtime._failure_save`); never blocks for long."""
        ...

    def rank_stacks(self, handle: AttemptHandle) -> dict[int, str]:
        """Every live rank's Python stack, by rank (for hang reports)."""
        ...

    def node_log_tail(self, handle: AttemptHandle, node: str, num_lines: int = 20) -> list[str]:
        """The last lines of the node's log: its ranks' output and its NodeRunner's notes."""
        ...
