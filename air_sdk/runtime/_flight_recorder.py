"""The env that turns on torch's flight recorder for a rank, so a hang can be explained.

For a GPU job the runner sets `AIR_FLIGHT_RECORDER=1`; the rank supervisor then adds,
before it starts the rank (torch reads them when the process group is created):

| variable | value | why |
| --- | --- | --- |
| `TORCH_NCCL_TRACE_BUFFER_SIZE`, `TORCH_FR_BUFFER_SIZE` | 2000 | keep the last 2000 collectives per rank |
| `TORCH_NCCL_DUMP_ON_TIMEOUT` | 1 | dump when NCCL's own watchdog times out |
| `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`, `TORCH_FR_DUMP_TEMP_FILE` | `$AIR_ATTEMPT_DIR/flight-recorder/rank_` | the dumps land as `rank_<R>` |
| `TORCH_NCCL_DEBUG_INFO_PIPE_FILE` | the same prefix | torch makes a FIFO `rank_<R>.pipe`; a write to it asks for a dump (the runner's way in, see `air_sdk.runner.flight_recorder`) |

A variable the job already sets is left alone. Never imports torch.

Example:
    >>> env = trace_env({"AIR_FLIGHT_RECORDER": "1", "AIR_ATTEMPT_DIR": "/a/1"})
    >>> env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    '/a/1/flight-recorder/rank_'
    >>> trace_env({"AIR_ATTEMPT_DIR": "/a/1"})
    {}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DUMP_PREFIX", "FLIGHT_RECORDER_ENV", "TRACE_DIR", "TRACE_ENTRIES", "trace_env"]

FLIGHT_RECORDER_ENV = "AIR_FLIGHT_RECORDER"
#: under the attempt directory
TRACE_DIR = "flight-recorder"
#: torch appends the global rank (and ".pipe" for the trigger FIFO)
DUMP_PREFIX = "rank_"
TRACE_ENTRIES = 2000


def trace_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to a rank's env (empty unless the runner asked for them),
    creating the dump directory."""
    env = os.environ if env is None else env
    attempt_dir = env.get("AIR_ATTEMPT_DIR")
    if env.get(FLIGHT_RECORDER_ENV) != "1" or not attempt_dir:
        return {}
    directory = Path(attempt_dir) / TRACE_DIR
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    prefix = str(directory / DUMP_PREFIX)
    wanted = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_ENTRIES),
        "TORCH_FR_BUFFER_SIZE": str(TRACE_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": prefix,
    }
    return {k: v for k, v in wanted.items() if k not in env}
