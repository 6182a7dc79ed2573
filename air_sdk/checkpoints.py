"""Checkpoints from the client's side: `export` a job's checkpoint as safetensors.

```python
import air_sdk

air_sdk.checkpoints.export("train-1a2b3c4d", step=300, to="model.safetensors")  # a job
air_sdk.checkpoints.export("/data/runs/ckpt", to="model.safetensors")  # a directory
air_sdk.checkpoints.export("s3://bucket/run/step-300", to="model.safetensors")
```

A job id is looked up on the gateway (its checkpoint events name each checkpoint's
directory); the files are then read from this machine, so they must be reachable
from it: the embedded local gateway's own directories are, and so is shared storage
(an fsspec URL such as `s3://...` with its credentials here, or a shared mount). A
directory only the gateway's machine can read is refused with what to do instead.
Reading needs torch and safetensors (`pip install 'air-runtime[train]'`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from air_sdk.errors import CheckpointError

if TYPE_CHECKING:
    from air_sdk.client import Client
    from air_sdk.runtime.checkpoint.export import Exported
    from air_sdk.schema.events import CheckpointCommit

__all__ = ["export", "export_hf", "is_location", "locate"]


def is_location(source: str) -> bool:
    """A path or URL rather than a job id (ids have no `/`; a bare name that exists
    here is a directory).

    Example:
        >>> is_location("s3://bucket/run"), is_location("train-1a2b3c4d")
        (True, False)
    """
    return "/" in source or os.sep in source or "://" in source or os.path.exists(source)


def locate(
    source: str | os.PathLike[str], step: int | None = None, *, client: Client | None = None
) -> str:
    """Where the checkpoint files of `source` (a job id, a checkpoint directory or URL)
    are, as a location this machine reads; a job's step `step` (default: its newest
    commit). CheckpointError says why not and what to do.

    Example:
        >>> locate("/data/runs/ckpt")
        '/data/runs/ckpt'
    """
    text = os.fspath(source)
    if is_location(text):
        return text
    from air_sdk.client import Client, Job

    commits = Job(client or Client(), text).checkpoints().commits
    if not commits:
        raise CheckpointError(f"job {text} has committed no checkpoint yet")
    chosen = _pick(text, commits, step)
    path = chosen.path
    if "://" in path:
        _check_readable(text, chosen.step, path)
        return path
    if not os.path.isdir(path):
        raise CheckpointError(
            f"job {text}'s checkpoint step {chosen.step} is at {path} on the gateway's machine,"
            " which this machine cannot read: run the export there (`air checkpoints export"
            f" {path} --to FILE`), or give the job a checkpoint directory both machines reach"
            " (JobSpec(checkpoint=CheckpointSpec(dir='s3://bucket/run')) or a shared mount)"
        )
    if not os.path.exists(os.path.join(path, "manifest.json")):
        raise CheckpointError(
            f"job {text}'s checkpoint step {chosen.step} ({path}) is gone: retention keeps the"
            f" newest few; `air checkpoints {text}` lists them, export a newer step"
        )
    return path


def _check_readable(job_id: str, step: int, url: str) -> None:
    from air_sdk.runtime._storage import storage_for

    try:
        storage = storage_for(url)
        found = storage.exists(storage.join(url, "manifest.json"))
    except Exception as exc:  # fsspec's backends raise their own (no credentials, no module)
        raise CheckpointError(
            f"job {job_id}'s checkpoint step {step} is at {url}, which this machine cannot read"
            f" ({type(exc).__name__}: {exc}): install that store's fsspec backend and give this"
            " machine its credentials, or run the export where the job's ranks ran"
        ) from exc
    if not found:
        raise CheckpointError(
            f"job {job_id}'s checkpoint step {step} ({url}) is gone: retention keeps the newest"
            f" few; `air checkpoints {job_id}` lists them, export a newer step"
        )


def _pick(job_id: str, commits: list[CheckpointCommit], step: int | None) -> CheckpointCommit:
    if step is None:
        return max(commits, key=lambda c: (c.step, c.attempt))
    found = [c for c in commits if c.step == step]
    if not found:
        steps = ", ".join(str(s) for s in sorted({c.step for c in commits}))
        raise CheckpointError(f"job {job_id} has no checkpoint of step {step}; it has {steps}")
    return max(found, key=lambda c: c.attempt)  # the newest commit of that step


def export(
    source: str | os.PathLike[str],
    step: int | None = None,
    to: str | os.PathLike[str] = "model.safetensors",
    *,
    key: str | None = None,
    dtype: str | None = None,
    client: Client | None = None,
) -> Exported:
    """Write the model of checkpoint `step` (default: the newest) of `source` (a job id,
    a checkpoint root or `step-N` directory, or an fsspec URL) to the safetensors file
    `to`: full (unsharded) tensors named as the unwrapped model names its parameters,
    whatever layout saved it. `key` picks the state entry when the checkpoint holds
    several models; `dtype` ("bfloat16", "float16", "float32") casts floating tensors.

    Example:
        >>> import air_sdk
        >>> air_sdk.checkpoints.export("train-1a2b3c4d", 300, "model.safetensors")  # doctest: +SKIP
        Exported(path='model.safetensors', step=300, key='model', num_tensors=291, ...)
    """
    location = locate(source, step, client=client)
    from air_sdk.runtime.checkpoint.export import export_safetensors

    # A job's commit names a step directory; a directory given by hand may be a root.
    wanted = step if is_location(os.fspath(source)) else None
    return export_safetensors(location, to, step=wanted, key=key, dtype=dtype)


def export_hf(
    source: str | os.PathLike[str],
    step: int | None = None,
    to: str | os.PathLike[str] = "hf",
    *,
    key: str | None = None,
    dtype: str | None = None,
    config: str | os.PathLike[str] | None = None,
    max_shard_size: int | str = "5GB",
    client: Client | None = None,
) -> Exported:
    """`export`, as a Hugging Face directory `to` (the weights in shards of at most
    `max_shard_size`, `model.safetensors` when they fit in one, else
    `model-0000i-of-0000n.safetensors` and `model.safetensors.index.json`; and the
    `config.json` the job loaded with `air.load_pretrained`, or the one in `config`), so
    `transformers`' `from_pretrained(to)` loads it. One shard is in memory at a time.

    Example:
        >>> air_sdk.checkpoints.export_hf("train-1a2b3c4d", to="tuned")  # doctest: +SKIP
        Exported(path='tuned', step=300, key='model', num_tensors=291, ...)
    """
    location = locate(source, step, client=client)
    from air_sdk.runtime.checkpoint.hf_export import export_hf as write_hf

    wanted = step if is_location(os.fspath(source)) else None
    return write_hf(
        location,
        to,
        step=wanted,
        key=key,
        dtype=dtype,
        config=config,
        max_shard_size=max_shard_size,
    )
