"""WorkerEnv: every environment variable AIR sets for a rank, or reads in one, named once.

A rank of an AIR job sees what torchrun would give it (so an unmodified torchrun
script runs), plus AIR's own variables. This model is the one place those names
are written: the runner renders it (`to_env()`), the NodeRunner starts ranks with
it, the runtime reads it back (`from_env()`), and render/k8s.py uses its names.

| field | variable | set by AIR to |
| --- | --- | --- |
| rank | RANK | node_rank x ranks_per_node + local_rank |
| local_rank | LOCAL_RANK | the rank's index on its node |
| world_size | WORLD_SIZE | nodes x ranks per node |
| local_world_size | LOCAL_WORLD_SIZE | ranks per node |
| group_rank | GROUP_RANK | the node's index in the placement |
| group_world_size | GROUP_WORLD_SIZE | nodes |
| role_name, role_rank, role_world_size | ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE | "default", RANK, WORLD_SIZE (one role) |
| master_addr, master_port | MASTER_ADDR, MASTER_PORT | rank 0's node and a port free there (from the placement: no rendezvous) |
| restart_count | TORCHELASTIC_RESTART_COUNT | AIR's restarts so far (attempt - 1) |
| max_restarts | TORCHELASTIC_MAX_RESTARTS | the job's max_restarts |
| run_id | TORCHELASTIC_RUN_ID | the job id (the same in every attempt, as torchrun's rdzv id) |
| use_agent_store | TORCHELASTIC_USE_AGENT_STORE | False: rank 0's `init_process_group` hosts the store |
| error_file | TORCHELASTIC_ERROR_FILE | where torch's `@record` writes the rank's error |
| cuda_visible_devices | CUDA_VISIBLE_DEVICES | the node's GPUs from the placement ("" on CPU) |
| job_id, attempt | AIR_JOB_ID, AIR_ATTEMPT | the job and the attempt number (1, 2, ...) |
| gateway_url, job_token | AIR_GATEWAY_URL, AIR_JOB_TOKEN | where ranks report, with a token for this attempt |
| node_name | AIR_NODE_NAME | the node's name in the placement |
| attempt_dir | AIR_ATTEMPT_DIR | the attempt's directory on this node (exit records, failure-save marks) |
| checkpoint_dir, checkpoint_keep | AIR_CHECKPOINT_DIR, AIR_CHECKPOINT_KEEP | from the job's CheckpointSpec |
| parallelism | AIR_PARALLELISM | the resolved mesh sizes (JSON of `Parallelism`) |
| checkpoint_every | AIR_CHECKPOINT_EVERY | the job's `checkpoint.every_steps` (`--checkpoint-every`): `air.checkpoint.due(step)` |
| output_dir | AIR_OUTPUT_DIR | the job's durable output directory (`--output-dir`; default `<gateway home>/outputs/<job>`) |
| flops_per_token | AIR_FLOPS_PER_TOKEN | with `JobSpec.model`: the planner's training FLOPs per token (for MFU) |
| flight_recorder | AIR_FLIGHT_RECORDER | "1" on GPU jobs: torch's NCCL flight recorder dumps under the attempt dir |
| autolog, peak_flops, mfu_dtype, count_flops, sample_interval_s, data_cache | AIR_AUTOLOG, AIR_PEAK_FLOPS, AIR_MFU_DTYPE, AIR_COUNT_FLOPS, AIR_SAMPLE_INTERVAL_S, AIR_DATA_CACHE | not set: switches a job may set in its `env` (USER_AIR_ENV) |
| checkpoint_on_failure, checkpoint_snapshot | AIR_CHECKPOINT_ON_FAILURE, AIR_CHECKPOINT_SNAPSHOT | not set: operator knobs read by the runtime (passed from the gateway's environment) |
| omp_num_threads | OMP_NUM_THREADS | 1 unless the job or the gateway sets it |
| python_unbuffered | PYTHONUNBUFFERED | 1 |
| gloo_socket_ifname | GLOO_SOCKET_IFNAME | "lo" for local virtual nodes unless set |
| nccl_async_error_handling | TORCH_NCCL_ASYNC_ERROR_HANDLING | 1 unless set (torchrun's default) |
| pwd | PWD | the rank's working directory |

Example:
    >>> env = WorkerEnv(rank=3, world_size=4, job_id="j1").to_env()
    >>> env["RANK"], env["WORLD_SIZE"], env["AIR_JOB_ID"]
    ('3', '4', 'j1')
    >>> WorkerEnv.from_env(env).rank
    3
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["AIR_ENV_PREFIX", "DEFAULTED_ENV", "RESERVED_ENV", "USER_AIR_ENV", "WorkerEnv"]

#: every variable AIR owns starts so; a job's `env` may set none of them
AIR_ENV_PREFIX = "AIR_"


class WorkerEnv(BaseModel):
    """The env contract of one rank (see the module docstring for every variable).

    Fields left None are not set. `to_env()` renders the variables, `from_env()`
    reads them back (missing or empty ones take the defaults: a script run by hand
    is rank 0 of a world of 1).

    Example:
        >>> WorkerEnv(rank=1, use_agent_store=False).to_env()["TORCHELASTIC_USE_AGENT_STORE"]
        'False'
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    # -- torchrun's (torch.distributed.elastic.agent.server.local_elastic_agent) -----------
    rank: int = Field(0, ge=0, alias="RANK")
    local_rank: int = Field(0, ge=0, alias="LOCAL_RANK")
    world_size: int = Field(1, ge=1, alias="WORLD_SIZE")
    local_world_size: int = Field(1, ge=1, alias="LOCAL_WORLD_SIZE")
    group_rank: int = Field(0, ge=0, alias="GROUP_RANK")
    group_world_size: int | None = Field(None, ge=1, alias="GROUP_WORLD_SIZE")
    role_name: str | None = Field(None, alias="ROLE_NAME")
    role_rank: int | None = Field(None, ge=0, alias="ROLE_RANK")
    role_world_size: int | None = Field(None, ge=1, alias="ROLE_WORLD_SIZE")
    master_addr: str | None = Field(None, alias="MASTER_ADDR")
    master_port: int | None = Field(None, ge=1, le=65535, alias="MASTER_PORT")
    restart_count: int = Field(0, ge=0, alias="TORCHELASTIC_RESTART_COUNT")
    max_restarts: int | None = Field(None, ge=0, alias="TORCHELASTIC_MAX_RESTARTS")
    run_id: str | None = Field(None, alias="TORCHELASTIC_RUN_ID")
    use_agent_store: bool | None = Field(None, alias="TORCHELASTIC_USE_AGENT_STORE")
    error_file: str | None = Field(None, alias="TORCHELASTIC_ERROR_FILE")
    cuda_visible_devices: str | None = Field(None, alias="CUDA_VISIBLE_DEVICES")

    # -- AIR's -------------------------------------------------------------------------------
    job_id: str | None = Field(None, alias="AIR_JOB_ID")
    attempt: int = Field(0, ge=0, alias="AIR_ATTEMPT")
    gateway_url: str | None = Field(None, alias="AIR_GATEWAY_URL")
    job_token: str | None = Field(None, alias="AIR_JOB_TOKEN", repr=False)
    node_name: str | None = Field(None, alias="AIR_NODE_NAME")
    attempt_dir: str | None = Field(None, alias="AIR_ATTEMPT_DIR")
    checkpoint_dir: str | None = Field(None, alias="AIR_CHECKPOINT_DIR")
    checkpoint_keep: int | None = Field(None, ge=1, alias="AIR_CHECKPOINT_KEEP")
    #: the job's `checkpoint.every_steps`: when `air.checkpoint.due(step)` says to save
    checkpoint_every: int | None = Field(None, ge=1, alias="AIR_CHECKPOINT_EVERY")
    #: JSON of `air_sdk.schema.Parallelism`, resolved for the world size
    parallelism: str | None = Field(None, alias="AIR_PARALLELISM")
    #: where a rank writes files to keep (`air.output_dir()`, `air outputs JOB`)
    output_dir: str | None = Field(None, alias="AIR_OUTPUT_DIR")
    #: the planner's training FLOPs per token of `JobSpec.model`, for the runtime's MFU
    flops_per_token: float | None = Field(None, gt=0, alias="AIR_FLOPS_PER_TOKEN")
    #: "1" on GPU jobs: the rank supervisor turns torch's NCCL flight recorder on
    flight_recorder: str | None = Field(None, alias="AIR_FLIGHT_RECORDER")
    #: operator knobs the runtime reads ("0" turns the failure save off; copy/fork/auto)
    checkpoint_on_failure: str | None = Field(None, alias="AIR_CHECKPOINT_ON_FAILURE")
    checkpoint_snapshot: str | None = Field(None, alias="AIR_CHECKPOINT_SNAPSHOT")

    # -- switches a job may set itself (`JobSpec.env`): see air_sdk.runtime ---------------------
    #: "0": no autolog of Lightning / transformers / accelerate / TensorBoard
    autolog: str | None = Field(None, alias="AIR_AUTOLOG")
    #: peak FLOP/s of a device the runtime's table lacks (for MFU)
    peak_flops: float | None = Field(None, gt=0, alias="AIR_PEAK_FLOPS")
    #: the dtype whose peak MFU is measured against (bf16, fp16, fp32, tf32)
    mfu_dtype: str | None = Field(None, alias="AIR_MFU_DTYPE")
    #: "0": do not count FLOPs with torch's counter when no model was declared
    count_flops: str | None = Field(None, alias="AIR_COUNT_FLOPS")
    #: seconds between the runtime's samples of GPU/CPU utilization
    sample_interval_s: float | None = Field(None, gt=0, alias="AIR_SAMPLE_INTERVAL_S")
    #: where `ShardStore` keeps remote shards (default: the rank's private /tmp)
    data_cache: str | None = Field(None, alias="AIR_DATA_CACHE")

    # -- settings AIR gives ranks unless the job or the gateway's environment does -----------
    omp_num_threads: int | None = Field(None, ge=1, alias="OMP_NUM_THREADS")
    python_unbuffered: str | None = Field(None, alias="PYTHONUNBUFFERED")
    gloo_socket_ifname: str | None = Field(None, alias="GLOO_SOCKET_IFNAME")
    nccl_async_error_handling: str | None = Field(None, alias="TORCH_NCCL_ASYNC_ERROR_HANDLING")
    pwd: str | None = Field(None, alias="PWD")

    @classmethod
    def env_name(cls, field: str) -> str:
        """The variable behind `field`.

        Example:
            >>> WorkerEnv.env_name("restart_count")
            'TORCHELASTIC_RESTART_COUNT'
        """
        alias = cls.model_fields[field].alias
        assert alias is not None
        return alias

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every variable of the contract.

        Example:
            >>> "AIR_JOB_ID" in WorkerEnv.names()
            True
        """
        return frozenset(f.alias for f in cls.model_fields.values() if f.alias)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerEnv:
        """Read the contract's variables from `env` (others are ignored; empty ones count
        as unset). Raises ValueError naming the variable and its value when one is
        malformed.

        Example:
            >>> WorkerEnv.from_env({"RANK": "2", "WORLD_SIZE": "4", "PATH": "/bin"}).world_size
            4
        """
        values = {}
        for name in cls.names():
            raw = env.get(name)
            if raw is not None and raw.strip():
                values[name] = raw.strip()
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else ""
            name = field if field in values else cls.env_name(field) if field else "?"
            raise ValueError(
                f"{name}={values.get(name)!r} is not valid ({error['msg'].lower()});"
                " unset it or launch with torchrun / `air run`"
            ) from None

    def to_env(self) -> dict[str, str]:
        """The variables of every field that is set, as strings (booleans as torchrun
        writes them: "True"/"False").

        Example:
            >>> WorkerEnv(rank=0, job_id="j").to_env()["AIR_ATTEMPT"]
            '0'
        """
        out: dict[str, str] = {}
        for field, info in type(self).model_fields.items():
            value: Any = getattr(self, field)
            if value is None or info.alias is None:
                continue
            out[info.alias] = str(value)
        return out


#: variables a job's `env` may not set: AIR sets them for every rank (any `AIR_*` too)
RESERVED_ENV = frozenset(
    WorkerEnv.env_name(f)
    for f in (
        "rank",
        "local_rank",
        "world_size",
        "local_world_size",
        "group_rank",
        "group_world_size",
        "role_name",
        "role_rank",
        "role_world_size",
        "master_addr",
        "master_port",
        "restart_count",
        "max_restarts",
        "run_id",
        "use_agent_store",
        "error_file",
        "cuda_visible_devices",
        "pwd",
    )
)

#: variables AIR sets only when neither the job nor the gateway's environment does
DEFAULTED_ENV = frozenset(
    WorkerEnv.env_name(f)
    for f in (
        "omp_num_threads",
        "python_unbuffered",
        "gloo_socket_ifname",
        "nccl_async_error_handling",
    )
)

#: AIR_* variables a job may set itself: switches and knobs of the worker runtime, not
#: its contract (`AIR_AUTOLOG=0` turns autolog off; `AIR_PEAK_FLOPS` for a GPU the
#: device table lacks, see air_sdk.runtime._throughput)
USER_AIR_ENV = frozenset(
    WorkerEnv.env_name(f)
    for f in (
        "autolog",
        "peak_flops",
        "mfu_dtype",
        "count_flops",
        "sample_interval_s",
        "data_cache",
    )
)
