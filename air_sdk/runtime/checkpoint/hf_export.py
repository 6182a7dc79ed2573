"""A committed checkpoint's model as a Hugging Face checkpoint directory.

`export_hf(location, to)` writes `to/model.safetensors` (full tensors, whatever layout
saved the checkpoint: `export_safetensors` does the reading) and the model's
`config.json` (and `generation_config.json`) beside it, so that
`transformers.AutoModelForCausalLM.from_pretrained(to)` loads it. The config comes
from `config=` (a directory holding `config.json`, e.g. the one the job loaded), or
else from what `air.load_pretrained` kept beside the job's checkpoints
(`<checkpoint dir>/hf-config/`).

Example:
    >>> from air_sdk.runtime.checkpoint.hf_export import export_hf
    >>> export_hf("/runs/ckpt", "/models/tuned", config="/models/tiny-llama")  # doctest: +SKIP
    Exported(path='/models/tuned', step=300, key='model', num_tensors=12, ...)
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from air_sdk.errors import CheckpointError
from air_sdk.runtime.checkpoint.export import Exported, export_safetensors
from air_sdk.runtime.hf_weights import CONFIG_FILES, HF_CONFIG_DIR

__all__ = ["WEIGHTS_NAME", "export_hf", "find_config"]

#: the weights file `from_pretrained` looks for first
WEIGHTS_NAME = "model.safetensors"


def find_config(location: str, config: str | os.PathLike[str] | None) -> str:
    """The directory holding the `config.json` to export with: `config` (a directory,
    or a `config.json` file), else `hf-config/` beside the checkpoint's steps.
    CheckpointError says what to pass when there is none.

    Example:
        >>> find_config("/tmp/air-no-such-ckpt", None)
        Traceback (most recent call last):
        ...
        air_sdk.errors.CheckpointError: no config.json for the Hugging Face export of /tmp/air-no-such-ckpt: pass config= / --config DIR, the directory of the checkpoint the job loaded (air.load_pretrained keeps a copy under the job's checkpoint directory, hf-config/, when it knows that directory)
    """
    if config is not None:
        path = os.fspath(config)
        directory = os.path.dirname(path) if os.path.basename(path) == "config.json" else path
        if not os.path.isfile(os.path.join(directory, "config.json")):
            raise CheckpointError(
                f"{path} holds no config.json: give the directory of a transformers"
                " checkpoint (what save_pretrained wrote), or its config.json"
            )
        return directory
    if "://" not in location:
        here = os.path.abspath(location)
        for root in (here, os.path.dirname(here)):  # a checkpoint root, or one step-N in it
            candidate = os.path.join(root, HF_CONFIG_DIR)
            if os.path.isfile(os.path.join(candidate, "config.json")):
                return candidate
    raise CheckpointError(
        f"no config.json for the Hugging Face export of {location}: pass config= / --config"
        " DIR, the directory of the checkpoint the job loaded (air.load_pretrained keeps a"
        f" copy under the job's checkpoint directory, {HF_CONFIG_DIR}/, when it knows that"
        " directory)"
    )


def export_hf(
    location: str | os.PathLike[str],
    to: str | os.PathLike[str],
    *,
    step: int | None = None,
    key: str | None = None,
    dtype: str | None = None,
    config: str | os.PathLike[str] | None = None,
) -> Exported:
    """Write the model of checkpoint `step` (default: the newest committed) under
    `location` as the Hugging Face directory `to` (created if missing; an existing
    `model.safetensors` in it is replaced): `model.safetensors` plus the config files.
    The result's `path` is the directory.

    Example:
        >>> export_hf("/runs/ckpt", "/models/tuned")  # doctest: +SKIP
        Exported(path='/models/tuned', step=300, ...)
    """
    where = os.fspath(location)
    config_dir = find_config(where, config)
    out = os.fspath(to)
    if os.path.exists(out) and not os.path.isdir(out):
        raise CheckpointError(f"{out} is a file: give a directory for --format hf")
    os.makedirs(out, exist_ok=True)
    stale = os.path.join(out, "model.safetensors.index.json")
    if os.path.exists(stale):  # from_pretrained would read the old shards it names
        raise CheckpointError(
            f"{out} holds a sharded checkpoint already ({stale}): export to an empty directory"
        )
    done = export_safetensors(
        where, os.path.join(out, WEIGHTS_NAME), step=step, key=key, dtype=dtype
    )
    for name in CONFIG_FILES:
        source = os.path.join(config_dir, name)
        if os.path.isfile(source):
            shutil.copyfile(source, os.path.join(out, name))
    return dataclasses.replace(done, path=out)
