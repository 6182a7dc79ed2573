"""JobSpec: what a user asks for. Validated on the client, again on the gateway."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from air_sdk.schema._guards import WireModel, bounded_mapping
from air_sdk.schema.export import ExportTarget, parse_targets
from air_sdk.schema.limits import JobLimits
from air_sdk.schema.names import (
    ACCELERATOR,
    ENV_NAME,
    NAME,
    SHA256,
    control_chars,
    is_valid,
    json_pattern,
    shown,
)
from air_sdk.schema.worker_env import AIR_ENV_PREFIX, RESERVED_ENV, USER_AIR_ENV, WorkerEnv

API_VERSION = "air/v1"

#: a module for `python -m` (matched whole: fullmatch)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

MAX_ENV_VARS = 256
MAX_ARGS = 1024
MAX_ARG_CHARS = 8192
MAX_INLINE_CODE_BYTES = 1 << 20

Priority = Literal["low", "normal", "high"]


class _Frozen(WireModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Resources(_Frozen):
    """How much of the cluster one job takes: `nodes` distinct nodes, each running
    `procs_per_node` ranks, with `gpus_per_node` GPUs each (0 on CPU).

    Example:
        >>> Resources(nodes=2, procs_per_node=1).world_size
        2
    """

    nodes: int = Field(1, ge=1, le=4096, description="Distinct nodes (gang-scheduled).")
    procs_per_node: int = Field(1, ge=1, le=256, description="Ranks per node.")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node; 0 runs on CPU.")

    @model_validator(mode="after")
    def _gpus_cover_ranks(self) -> Resources:
        if self.gpus_per_node and self.procs_per_node not in (1, self.gpus_per_node):
            # One rank per GPU is the only layout torchrun users expect.
            raise ValueError(
                f"procs_per_node={self.procs_per_node} does not match gpus_per_node="
                f"{self.gpus_per_node}: give one rank per GPU (omit procs_per_node)"
            )
        return self

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node or self.procs_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


#: Mesh dimension names, outermost first (torchtitan's order): pipeline stages, then
#: replicated data parallel, sharded data parallel (FSDP), context parallel, tensor parallel.
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

#: The env var that carries the resolved layout to every rank (JSON of `Parallelism`).
PARALLELISM_ENV = WorkerEnv.env_name("parallelism")
#: Training FLOPs per token of `JobSpec.model` (the planner's count), for the runtime's MFU.
FLOPS_PER_TOKEN_ENV = WorkerEnv.env_name("flops_per_token")


class Parallelism(_Frozen):
    """How a job's ranks split the model and the data: the sizes of the device mesh.

    The product of the sizes equals the world size; `dp_shard=-1` takes whatever the
    other sizes leave. The default is plain data parallelism over FSDP-free replicas:
    `dp_shard=-1` with everything else 1 means every rank is a data-parallel rank.

    Example:
        >>> Parallelism(tp=2).resolve(8).dp_shard
        4
        >>> Parallelism(tp=2, pp=2).resolve(8).sizes()
        {'pp': 2, 'dp_replicate': 1, 'dp_shard': 2, 'cp': 1, 'tp': 2}
    """

    dp_replicate: int = Field(
        1, ge=1, le=4096, description="Replicated data parallel (HSDP's outer dim)."
    )
    dp_shard: int = Field(
        -1,
        ge=-1,
        le=4096,
        description="Sharded data parallel (FSDP2); -1: what the world size leaves.",
    )
    tp: int = Field(
        1, ge=1, le=256, description="Tensor (and sequence) parallel; stays inside one node."
    )
    pp: int = Field(1, ge=1, le=256, description="Pipeline stages.")
    cp: int = Field(1, ge=1, le=256, description="Context parallel (needs GPUs).")

    @field_validator("dp_shard")
    @classmethod
    def _shard_ok(cls, v: int) -> int:
        if v == 0:
            raise ValueError("dp_shard=0: give a size of at least 1, or -1 for what is left")
        return v

    @property
    def is_default(self) -> bool:
        """True when nothing but data parallelism is asked for (any world size fits)."""
        return (self.dp_replicate, self.dp_shard, self.tp, self.pp, self.cp) == (1, -1, 1, 1, 1)

    def resolve(self, world_size: int) -> Parallelism:
        """The layout with `dp_shard=-1` replaced by what `world_size` leaves.

        Raises ValueError, saying what to change, when the sizes do not multiply to
        `world_size`.

        Example:
            >>> Parallelism(dp_shard=4).resolve(6)
            Traceback (most recent call last):
            ...
            ValueError: parallelism dp_replicate=1 x dp_shard=4 x cp=1 x tp=1 x pp=1 = 4 ranks, but the job has 6 (nodes x ranks per node): change a size, or give dp_shard=-1 to use what is left
        """
        fixed = self.dp_replicate * self.tp * self.pp * self.cp
        shard = self.dp_shard
        if shard == -1:
            if world_size % fixed:
                raise ValueError(
                    f"parallelism dp_replicate={self.dp_replicate} x cp={self.cp} x tp={self.tp}"
                    f" x pp={self.pp} = {fixed} does not divide the job's {world_size} ranks"
                    " (nodes x ranks per node): change a size or the number of ranks"
                )
            shard = world_size // fixed
        if fixed * shard != world_size:
            raise ValueError(
                f"parallelism dp_replicate={self.dp_replicate} x dp_shard={shard} x cp={self.cp}"
                f" x tp={self.tp} x pp={self.pp} = {fixed * shard} ranks, but the job has"
                f" {world_size} (nodes x ranks per node): change a size, or give dp_shard=-1"
                " to use what is left"
            )
        return self.model_copy(update={"dp_shard": shard})

    def sizes(self) -> dict[str, int]:
        """{dim: size} in mesh order (`MESH_DIMS`), as `init_device_mesh` takes them."""
        return {d: getattr(self, d) for d in MESH_DIMS}


#: model shape fields that together describe a transformer without a preset
MODEL_SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "vocab_size")


class ModelSpec(_Frozen):
    """What the job trains, as much as the memory planner (`air plan`) needs: a preset
    name, a parameter count, or a transformer's shape, plus the batch it runs.

    With it, a GPU job whose layout cannot fit its GPUs is refused at submit, with a
    layout that fits. Shape fields override a preset's.

    Example:
        >>> ModelSpec(preset="llama3-8b", seq_len=8192).seq_len
        8192
        >>> ModelSpec(num_params=7_000_000_000).num_params
        7000000000
    """

    preset: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$",
        description="A known model: llama3-8b, llama3-70b, gpt2-124m (see `air plan --help`).",
    )
    num_params: int | None = Field(
        None, ge=1, description="Parameter count, when the shape is not given."
    )
    arch: Literal["llama", "gpt2"] | None = Field(
        None, description="Block layout: llama (SwiGLU, RMSNorm) or gpt2 (GELU, LayerNorm)."
    )
    num_layers: int | None = Field(None, ge=1, le=10_000)
    hidden_size: int | None = Field(None, ge=1, le=1_000_000)
    num_heads: int | None = Field(None, ge=1, le=10_000)
    num_kv_heads: int | None = Field(None, ge=1, le=10_000, description="Default: num_heads.")
    vocab_size: int | None = Field(None, ge=1, le=100_000_000)
    ffn_hidden_size: int | None = Field(
        None, ge=1, le=10_000_000, description="Default: 4 x hidden_size."
    )
    seq_len: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Tokens per sequence; default: the preset's (8192 for Llama 3), else 2048.",
    )
    micro_batch: int = Field(1, ge=1, le=1_000_000, description="Sequences per micro-batch.")
    grad_accum: int = Field(
        1, ge=1, le=1_000_000, description="Micro-batches per step on each data-parallel rank."
    )
    activation_checkpointing: bool | None = Field(
        None, description="None: the planner may use it where it is needed to fit."
    )
    precision: Literal["bf16-mixed", "fp32"] = Field(
        "bf16-mixed", description="bf16 compute on fp32 parameters and optimizer state, or fp32."
    )

    @model_validator(mode="after")
    def _described(self) -> ModelSpec:
        if self.preset is not None or self.num_params is not None:
            return self
        given = [f for f in MODEL_SHAPE_FIELDS if getattr(self, f) is not None]
        if not given:
            raise ValueError(
                "describe the model: give preset (e.g. llama3-8b), num_params, or its shape"
                f" ({', '.join(MODEL_SHAPE_FIELDS)})"
            )
        missing = [f for f in MODEL_SHAPE_FIELDS if getattr(self, f) is None]
        if missing:
            raise ValueError(f"the model's shape misses {', '.join(missing)}")
        return self


class CheckpointSpec(_Frozen):
    """Where and how often the job checkpoints (used by `air_sdk.runtime.checkpoint`)."""

    dir: str | None = Field(None, description="Local path or fsspec URL; default: under the job.")
    every_steps: int | None = Field(None, ge=1, description="Hint for the training loop.")
    keep: int = Field(3, ge=1, le=1000, description="Committed checkpoints to keep.")

    @field_validator("dir")
    @classmethod
    def _dir_ok(cls, v: str | None) -> str | None:
        if v is not None and control_chars(v):
            raise ValueError(f"checkpoint dir {shown(v)} holds control characters")
        return v


class FailurePolicySpec(_Frozen):
    """How the runner reacts to failures (the budget itself is `JobSpec.max_restarts`).

    Example:
        >>> FailurePolicySpec(non_retryable_exit_codes=[2]).backoff_base_s
        1.0
    """

    backoff_base_s: float = Field(1.0, ge=0, le=3600, description="First restart delay.")
    backoff_max_s: float = Field(60.0, ge=0, le=86400, description="Longest restart delay.")
    non_retryable_exit_codes: list[int] = Field(
        default_factory=list,
        max_length=256,
        description="A rank exiting with one of these fails the job at once.",
    )
    non_retryable_patterns: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Regexes; a failing rank whose log tail matches one fails the job at once.",
    )
    hang_timeout_s: float | None = Field(
        None,
        gt=0,
        description="No progress for this long is a hang; default max(60 s, 3x the p99 step"
        " time). For a script that never calls air.log: no output and no CPU/GPU use from any"
        " rank for this long; default 300 s.",
    )
    preemption_grace_s: float = Field(
        30.0, ge=0, le=3600, description="SIGTERM-to-SIGKILL grace when the job is preempted."
    )

    @field_validator("non_retryable_patterns")
    @classmethod
    def _patterns_compile(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"non_retryable_patterns: {pattern!r} is not a regex: {exc}"
                ) from exc
        return v

    @model_validator(mode="after")
    def _backoff_order(self) -> FailurePolicySpec:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")
        return self


class JobSpec(_Frozen):
    """A training job. Exactly one of `entrypoint` (a script in the bundle), `module`
    (run as `python -m`) or `code` (inline Python, e.g. a notebook cell) is set.

    Example:
        >>> spec = JobSpec(name="mnist", entrypoint="train.py", resources=Resources(nodes=2))
        >>> spec.resources.world_size
        2
    """

    api_version: Literal["air/v1"] = "air/v1"
    name: str = Field(
        "job",
        description="A label for people; 1-63 of [A-Za-z0-9._-].",
        json_schema_extra={"pattern": json_pattern(NAME)},
    )
    entrypoint: str | None = Field(None, description="Script path, relative to the bundle root.")
    module: str | None = Field(
        None,
        description="Module run as `python -m MODULE` (torchrun's -m), imported from the"
        " bundle root or the installed packages.",
    )
    code: str | None = Field(None, description="Inline Python source run on every rank.")
    args: list[str] = Field(
        default_factory=list, max_length=MAX_ARGS, description="argv after the script."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra env for every rank.")
    resources: Resources = Field(default_factory=Resources)
    pool: str = Field(
        "default",
        description="Pool to run in; 'any' lets the scheduler choose.",
        json_schema_extra={"pattern": json_pattern(NAME)},
    )
    accelerator: str | None = Field(
        None,
        # pydantic checks `pattern` with Rust's regex, where `$` is the end of the input
        # only ("a100\n" is refused; a test holds it)
        pattern=json_pattern(ACCELERATOR),
        description="Accelerator type to run on ('a100', 'h100', 'cpu'; 'gpu': any GPU);"
        " None: whatever the pool has.",
    )
    priority: Priority = Field(
        "normal", description="low, normal or high; high may preempt lower classes."
    )
    max_restarts: int = Field(0, ge=0, le=1000, description="Relaunches after a failure.")
    timeout_s: float | None = Field(None, gt=0, description="Wall-clock limit of the whole job.")
    startup_timeout_s: float = Field(
        300, gt=0, description="Launch to first sign of life of every node before failing."
    )
    parallelism: Parallelism = Field(
        default_factory=Parallelism,
        description="Mesh sizes (FSDP, TP, PP, CP); the ranks read them from AIR_PARALLELISM.",
    )
    model: ModelSpec | None = Field(
        None,
        description="What is trained, for the memory planner; a GPU job whose layout"
        " cannot fit its GPUs is then refused at submit.",
    )
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    total_steps: int | None = Field(
        None,
        ge=1,
        le=10**12,
        # left out of the wire form when unset: a gateway from before it still takes the spec
        exclude_if=lambda v: v is None,
        description="The run's length in steps, for every view's progress bar and ETA"
        " (a `total_steps` a rank logs with air.log wins); None: unknown.",
    )
    output_dir: str | None = Field(
        None,
        description="Durable directory for the files the job keeps (AIR_OUTPUT_DIR, `air"
        " outputs`): an absolute path the nodes (and the gateway, to list it) share, or an"
        " fsspec URL; None: <gateway home>/outputs/<job id> (on Ray, under AIR_RAY_STORAGE).",
    )
    failure: FailurePolicySpec = Field(default_factory=FailurePolicySpec)
    export: list[ExportTarget] = Field(
        default_factory=list,
        max_length=3,
        description="Trackers the gateway forwards the job's metrics, checkpoints and final"
        " state to (mlflow, wandb, tensorboard; one each), from the event log.",
    )
    limits: JobLimits = Field(
        default_factory=JobLimits,
        description="Memory, processes and disk the job may use on each node (under the"
        " operator's caps); past one the job fails, not retried, saying which.",
    )
    bundle_sha256: str | None = Field(None, description="Content address of the uploaded code.")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not is_valid(NAME, v):
            raise ValueError(
                f"name {shown(v)} must be 1-63 characters of letters, digits, '.', '_' or '-',"
                " starting with a letter or digit"
            )
        return v

    @field_validator("pool")
    @classmethod
    def _pool_ok(cls, v: str) -> str:
        if not is_valid(NAME, v):
            raise ValueError(
                f"pool {shown(v)} must be 1-63 characters of letters, digits, '.', '_' or"
                " '-', or 'any' to let the scheduler choose"
            )
        return v

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_ok(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip():
            raise ValueError("entrypoint is empty: give a script path such as train.py")
        if control_chars(v):
            raise ValueError(f"entrypoint {shown(v)} holds control characters: give a script path")
        if v.startswith("-"):
            raise ValueError(
                f"entrypoint {v!r} starts with '-': python would read it as an option;"
                " rename the script (or use module= for `python -m`)"
            )
        if v.startswith("/") or ".." in v.replace("\\", "/").split("/"):
            raise ValueError(
                f"entrypoint {v!r} must be a path inside the bundle (relative, no '..')"
            )
        return v

    @field_validator("module")
    @classmethod
    def _module_ok(cls, v: str | None) -> str | None:
        if v is not None and not _MODULE.fullmatch(v):
            raise ValueError(
                f"module {v!r} is not a dotted module name such as pkg.train"
                " (python -m takes a module, not a file path)"
            )
        return v

    @field_validator("code")
    @classmethod
    def _code_ok(cls, v: str | None) -> str | None:
        if v is not None and len(v.encode()) > MAX_INLINE_CODE_BYTES:
            raise ValueError(
                f"inline code is {len(v.encode())} bytes; the limit is {MAX_INLINE_CODE_BYTES}:"
                " put it in a file and submit the file"
            )
        return v

    @field_validator("args")
    @classmethod
    def _args_ok(cls, v: list[str]) -> list[str]:
        if len(v) > MAX_ARGS:
            raise ValueError(f"{len(v)} args; the limit is {MAX_ARGS}")
        for a in v:
            if len(a) > MAX_ARG_CHARS or "\x00" in a:
                raise ValueError(f"an arg is over {MAX_ARG_CHARS} characters or holds a NUL byte")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_size_ok(cls, v: object) -> object:
        # Before the entries are validated: 700k bad entries would be 700k errors.
        return bounded_mapping("env", v, MAX_ENV_VARS)

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_VARS:
            raise ValueError(f"{len(v)} env vars; the limit is {MAX_ENV_VARS}")
        for k, val in v.items():
            if not is_valid(ENV_NAME, k):
                raise ValueError(
                    f"env name {shown(k)} is not a valid variable name: letters, digits"
                    " and '_', not starting with a digit"
                )
            if k in RESERVED_ENV or (k.startswith(AIR_ENV_PREFIX) and k not in USER_AIR_ENV):
                raise ValueError(f"env {k} is set by AIR for every rank; remove it from env")
            if "\x00" in val or len(val) > MAX_ARG_CHARS:
                raise ValueError(f"env {k} is over {MAX_ARG_CHARS} characters or holds a NUL")
        return v

    @field_validator("output_dir")
    @classmethod
    def _output_dir_ok(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if control_chars(v) or not v.strip():
            raise ValueError(f"output_dir {shown(v)} is empty or holds control characters")
        if "://" not in v and not v.startswith("/"):
            raise ValueError(
                f"output_dir {v!r} is relative: ranks start in the job's code copy, which"
                " `air gc` deletes; give an absolute path every node mounts, or leave it out"
                " for <gateway home>/outputs/<job id>"
            )
        if "://" not in v and ".." in v.split("/"):
            raise ValueError(f"output_dir {v!r} holds '..': give the directory itself")
        return v

    @field_validator("export", mode="before")
    @classmethod
    def _export_texts(cls, v: object) -> object:
        return parse_targets(v)

    @field_validator("export")
    @classmethod
    def _export_once_each(cls, v: list[ExportTarget]) -> list[ExportTarget]:
        seen = [t.to for t in v]
        twice = sorted({to for to in seen if seen.count(to) > 1})
        if twice:
            raise ValueError(f"export names {', '.join(twice)} twice: one destination each")
        return v

    @field_validator("bundle_sha256")
    @classmethod
    def _sha_ok(cls, v: str | None) -> str | None:
        if v is not None and not is_valid(SHA256, v):
            raise ValueError("bundle_sha256 must be 64 lowercase hex digits")
        return v

    @model_validator(mode="after")
    def _layout_fits(self) -> JobSpec:
        layout = self.parallelism
        if layout.is_default:
            return self
        res = self.resources
        layout.resolve(res.world_size)  # raises with the arithmetic
        per_node = res.ranks_per_node
        if layout.tp > per_node or per_node % layout.tp:
            raise ValueError(
                f"tp={layout.tp} must stay inside one node: it has to divide the"
                f" ranks per node, {per_node} here (tensor parallel talks every layer; across"
                " nodes it is too slow): lower tp or raise procs_per_node/gpus_per_node"
            )
        if layout.cp > 1 and not res.gpus_per_node:
            raise ValueError(
                f"cp={layout.cp} needs GPUs: context parallelism runs ring attention on CUDA"
                " SDPA kernels; set gpus_per_node, or use cp=1 on CPU"
            )
        return self

    @model_validator(mode="after")
    def _one_program(self) -> JobSpec:
        if [self.entrypoint, self.module, self.code].count(None) != 2:
            raise ValueError(
                "give exactly one of entrypoint (a script), module (python -m) or code"
                " (inline Python)"
            )
        return self
