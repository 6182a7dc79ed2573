"""Parallelism for training code: the job's device mesh, FSDP2 + TP + PP + CP on it.

```python
import air_sdk.runtime as air

air.init()
mesh = air.mesh()                              # dims pp, dp_replicate, dp_shard, cp, tp
model = air.parallelize(build_model())         # TP -> AC -> compile -> FSDP2, per the layout
# or, with pp > 1:
pipe = air.pipeline(build_model(), microbatches=4, loss_fn=loss_fn)
loss = pipe.step(tokens, targets)
air.log(step=step, loss=air.dp_mean(loss))
```

The layout comes from the job (`JobSpec.parallelism`, the `--tp/--pp/--dp-shard` flags)
through `AIR_PARALLELISM`; nothing in the script names a size. Importing this package
imports torch; `import air_sdk.runtime` does not (it exports these names lazily).
"""

from __future__ import annotations

from air_sdk.runtime.parallel.apply import builtin_tp_plan, parallelize
from air_sdk.runtime.parallel.blocks import Blocks, StageSplit, find_blocks, split_stages
from air_sdk.runtime.parallel.context import context_parallel
from air_sdk.runtime.parallel.meshes import (
    FLATTENED_DIMS,
    dp_mean,
    layout_of,
    mesh,
    read_layout,
    submesh,
)
from air_sdk.runtime.parallel.pipelines import SCHEDULES, Pipeline, pipeline
from air_sdk.runtime.parallel.plans import GatherSequence

__all__ = [
    "FLATTENED_DIMS",
    "SCHEDULES",
    "Blocks",
    "GatherSequence",
    "Pipeline",
    "StageSplit",
    "builtin_tp_plan",
    "context_parallel",
    "dp_mean",
    "find_blocks",
    "layout_of",
    "mesh",
    "parallelize",
    "pipeline",
    "read_layout",
    "split_stages",
    "submesh",
]
