"""What one node runs for one attempt: `NodeLaunch`, as the runner plans it.

Plain dataclasses that travel as JSON (to a local NodeRunner process) or pickled (to
a Ray node actor). Each rank's own variables (the job's `env` and the contract,
rendered from `air_sdk.schema.WorkerEnv` by `air_sdk.runner.node.plan`) are here;
the NodeRunner puts them over the environment it starts ranks from, so it needs
neither pydantic nor the schema to start them: it reads this and forks. Standard
library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from air_sdk.runner.node.limits import NodeLimits

__all__ = [
    "MODULE_PREFIX",
    "WARM_IMPORTS",
    "NodeLaunch",
    "RankLaunch",
    "import_sensitive",
    "program_argv",
]

#: what a warm interpreter imports before it is handed a rank: torch, what
#: `DistributedDataParallel()` imports on first use (`torch._dynamo`, about 1 s here)
#: and AIR's runtime with its reporting (requests, pydantic)
WARM_IMPORTS = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "air_sdk.runtime._api",
)

#: variables that shape an interpreter while it starts and imports torch: a warm
#: interpreter serves only ranks whose environment agrees with its own on these
_IMPORT_SENSITIVE_PREFIXES = (
    "PYTHON",
    "LD_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "MALLOC_",
    "GLIBC_",
    "CUDA_",
)


#: ...except these, which torch reads when a process group is made, not on import: the
#: flight recorder's (`air_sdk.runtime._flight_recorder`) name the attempt's directory
_READ_LATER_PREFIXES = ("TORCH_NCCL_", "TORCH_FR_")


def import_sensitive(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` a warm interpreter must share with the rank it becomes.

    Example:
        >>> import_sensitive({"PYTHONPATH": "/code", "RANK": "3", "LOGLEVEL": "INFO",
        ...                   "TORCH_FR_DUMP_TEMP_FILE": "/att/2/fr"})
        {'PYTHONPATH': '/code', 'LOGLEVEL': 'INFO'}
    """
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(_IMPORT_SENSITIVE_PREFIXES) and not k.startswith(_READ_LATER_PREFIXES))
        or k == "LOGLEVEL"
    }


#: how an entrypoint says "run this module" (`python -m`)
MODULE_PREFIX = "-m "


def program_argv(entrypoint: str) -> list[str]:
    """What follows `python -m air_sdk.runtime.supervise` for an entrypoint: the
    script, or `-m MODULE` for a module job (JobSpec.module).

    Example:
        >>> program_argv("-m pkg.train"), program_argv("train.py")
        (['-m', 'pkg.train'], ['train.py'])
    """
    if entrypoint.startswith(MODULE_PREFIX):
        return ["-m", entrypoint.removeprefix(MODULE_PREFIX)]
    return [entrypoint]


@dataclass(frozen=True)
class RankLaunch:
    """One rank of a node: its numbers and its whole environment."""

    rank: int
    local_rank: int
    env: dict[str, str]


@dataclass(frozen=True)
class NodeLaunch:
    """One node's share of an attempt.

    Example:
        >>> launch = NodeLaunch("j1", 1, "node-0", "/code", ["train.py"], [], "/att/1", "/att/1/n.log")
        >>> NodeLaunch.from_json(launch.to_json()) == launch
        True
    """

    job_id: str
    attempt: int
    node: str
    #: every rank's working directory (the unpacked job code)
    cwd: str
    #: what follows `python -u`: [SCRIPT, ARGS...] or ["-m", MODULE, ARGS...]
    command: list[str]
    ranks: list[RankLaunch]
    #: this node's directory of the attempt: exit records, failure-save marks
    attempt_dir: str
    #: where the ranks' output (prefixed `[rank N] `) and the NodeRunner's notes go
    log_path: str
    #: put in front of every rank's interpreter (a sandbox such as `bwrap ... --`)
    wrapper: list[str] = field(default_factory=list)
    #: set for every rank unless the environment it starts from sets them
    defaults: dict[str, str] = field(default_factory=dict)
    #: variables that change from one attempt (or rank) to the next: a warm interpreter
    #: starts without them and is matched to a rank on the rest
    attempt_env: list[str] = field(default_factory=list)
    #: keep pre-imported interpreters ready for this job's next attempt on this node
    warm: bool = True
    warm_imports: list[str] = field(default_factory=lambda: list(WARM_IMPORTS))
    #: what the job may use on this node (`air_sdk.runner.node.limits`)
    limits: NodeLimits = field(default_factory=NodeLimits)

    @property
    def ranks_per_node(self) -> int:
        return len(self.ranks)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeLaunch:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeLaunch:
        values = dict(data)
        values["ranks"] = [RankLaunch(**r) for r in values.get("ranks", [])]
        values["limits"] = NodeLimits.from_dict(values.get("limits"))
        return cls(**values)
