"""What training code imports inside an AIR worker (or anywhere else).

```python
import air_sdk.runtime as air

ctx = air.init()                      # process group from torchrun's env, or a world of 1
for step in range(num_steps):
    loss = train_step()
    air.log(step=step, loss=loss)     # cheap: queued, posted by a background thread
if air.is_main():
    print("done")
del model
air.shutdown()                        # commit a save in flight, flush, destroy the group
```

Checkpoints: `air.checkpoint.save(state, step=...)`, `step = air.checkpoint.load(state)`
(see `air_sdk.runtime.checkpoint`); exact data resume: `air.resumable_loader(...)`;
streaming shards: `air.data.ShardedDataset(dir, seq_len=...)` and
`air.data.loader(dataset, batch_size, num_workers=...)`;
data-loading metrics: `for batch in air.data.timed(loader)` (docs/data.md).
Files to keep (models, eval results): `air.output_dir()` (the job's `AIR_OUTPUT_DIR`,
listed by `air outputs JOB`); `air.checkpoint.due(step)` says when `--checkpoint-every`
asks for a save.
Graceful preemption: `if air.should_stop(): air.checkpoint.save(...); air.exit_stopped()`.
Lightning, transformers and accelerate report to AIR with no code change in an AIR
job; `air.autolog()` does the same elsewhere (docs/integrations.md).

Parallelism from the job's layout (`air_sdk.runtime.parallel`): `air.mesh()`,
`model = air.parallelize(model)`, `pipe = air.pipeline(model, microbatches=..., loss_fn=...)`,
`air.context_parallel(...)`, `air.dp_mean(loss)`; `air.layout()` says this rank's
data-parallel rank and size, pipeline stage and the rest (see `_layout.py`). Hugging
Face safetensors straight into the shards: `air.load_pretrained(model, directory)`;
and out: `air.save_pretrained(model, directory)` (`air_sdk.runtime.hf_weights`).

Without the `AIR_*` env (a script run by hand or by bare torchrun) nothing is
posted: `log()` only keeps the latest values. Importing this package does not
import torch; `init()` does.
"""

from __future__ import annotations

from typing import Any

from air_sdk.runtime._context import Context, context

__all__ = [
    "Context",
    "Layout",
    "Pipeline",
    "StatefulDistributedSampler",
    "autolog",
    "checkpoint",
    "context",
    "context_parallel",
    "data",
    "dp_mean",
    "exit_stopped",
    "flush",
    "heartbeat",
    "init",
    "is_main",
    "layout",
    "load_pretrained",
    "log",
    "mesh",
    "output_dir",
    "parallel",
    "parallelize",
    "pipeline",
    "resumable_loader",
    "save_pretrained",
    "should_stop",
    "shutdown",
    "submesh",
]

_LAZY = frozenset({"flush", "heartbeat", "init", "is_main", "log", "shutdown"})
_LAZY_DATA = frozenset({"StatefulDistributedSampler", "resumable_loader"})
_LAZY_STOP = frozenset({"exit_stopped", "should_stop"})
_LAZY_PARALLEL = frozenset(
    {"Pipeline", "context_parallel", "dp_mean", "mesh", "parallelize", "pipeline", "submesh"}
)


def __getattr__(name: str) -> Any:
    # The rank supervisor imports this package before it starts every rank; loading
    # requests, tenacity and pydantic only on first use keeps that start fast. The
    # value is then cached as a module global, so `air.log` costs nothing extra.
    if name in _LAZY:
        from air_sdk.runtime import _api

        value = getattr(_api, name)
        globals()[name] = value
        return value
    if name in ("Layout", "layout"):  # torch-free: the layout's arithmetic
        from air_sdk.runtime import _layout

        value = getattr(_layout, name)
        globals()[name] = value
        return value
    if name == "output_dir":
        from air_sdk.runtime._outputs import output_dir

        globals()[name] = output_dir
        return output_dir
    if name == "autolog":
        from air_sdk.runtime._autolog import autolog

        globals()[name] = autolog
        return autolog
    if name in ("checkpoint", "data", "parallel"):  # submodules: importing binds them here too
        import importlib

        return importlib.import_module(f"air_sdk.runtime.{name}")
    if name in _LAZY_STOP:
        from air_sdk.runtime import _stop

        value = getattr(_stop, name)
        globals()[name] = value
        return value
    if name in _LAZY_PARALLEL:  # imports torch
        from air_sdk.runtime import parallel

        value = getattr(parallel, name)
        globals()[name] = value
        return value
    if name in ("load_pretrained", "save_pretrained"):  # torch only when called
        from air_sdk.runtime import hf_weights

        value = getattr(hf_weights, name)
        globals()[name] = value
        return value
    if name in _LAZY_DATA:  # imports torch
        from air_sdk.runtime import data

        value = getattr(data, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'air_sdk.runtime' has no attribute {name!r}")
