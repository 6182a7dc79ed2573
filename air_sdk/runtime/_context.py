"""Who this process is in the job, read from the launcher's environment.

The env contract is `air_sdk.schema.WorkerEnv`: torchrun's variables plus the
`AIR_*` ones the runner adds. Every variable may be absent: a script run by
hand is rank 0 of a world of 1, with no job and no gateway.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from air_sdk.errors import ConfigError

__all__ = ["Context", "context", "job_token"]


@dataclass(frozen=True)
class Context:
    """This process's place in the job.

    Example:
        >>> Context(rank=0, world_size=2).is_main
        True
    """

    rank: int = 0
    """Global rank (torchrun's `RANK`)."""
    local_rank: int = 0
    """Rank on this node; also the CUDA device index (`LOCAL_RANK`)."""
    world_size: int = 1
    """Number of ranks in the job (`WORLD_SIZE`)."""
    local_world_size: int = 1
    """Number of ranks on this node (`LOCAL_WORLD_SIZE`)."""
    group_rank: int = 0
    """Rank of this node among the job's nodes (`GROUP_RANK`)."""
    job_id: str | None = None
    """The AIR job, or None outside AIR (`AIR_JOB_ID`)."""
    attempt: int = 0
    """The attempt number; 0 for the first launch (`AIR_ATTEMPT`)."""
    node_name: str = ""
    """The node's name (`AIR_NODE_NAME`, else the host name)."""
    checkpoint_dir: str | None = None
    """Where this job's checkpoints live (`AIR_CHECKPOINT_DIR`)."""
    gateway_url: str | None = None
    """The gateway that receives this rank's reports (`AIR_GATEWAY_URL`)."""
    restart_count: int = 0
    """How often the job was restarted so far (`TORCHELASTIC_RESTART_COUNT`, as torchrun's)."""

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that should print and write summaries."""
        return self.rank == 0

    @property
    def has_gateway(self) -> bool:
        """True when reports can be posted (a gateway URL and a job id are set)."""
        return bool(self.gateway_url) and bool(self.job_id)


def context(env: Mapping[str, str] | None = None) -> Context:
    """Read this process's Context from the environment (or from `env`).

    Example:
        >>> context({"RANK": "3", "WORLD_SIZE": "4"}).rank
        3
        >>> context({}).world_size
        1
    """
    from air_sdk.schema.worker_env import WorkerEnv  # pydantic: loaded when first read

    try:
        worker = WorkerEnv.from_env(os.environ if env is None else env)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return Context(
        rank=worker.rank,
        local_rank=worker.local_rank,
        world_size=worker.world_size,
        local_world_size=worker.local_world_size,
        group_rank=worker.group_rank,
        job_id=worker.job_id,
        attempt=worker.attempt,
        node_name=worker.node_name or socket.gethostname(),
        checkpoint_dir=worker.checkpoint_dir,
        gateway_url=worker.gateway_url,
        restart_count=worker.restart_count,
    )


def job_token(env: Mapping[str, str] | None = None) -> str | None:
    """The worker token for this job and attempt (`AIR_JOB_TOKEN`); kept out of Context's repr.

    Example:
        >>> job_token({"AIR_JOB_TOKEN": "t0k"})
        't0k'
    """
    from air_sdk.schema.worker_env import WorkerEnv

    value = (os.environ if env is None else env).get(WorkerEnv.env_name("job_token"), "")
    return value.strip() or None
