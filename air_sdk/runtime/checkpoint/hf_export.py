"""A committed checkpoint's model as a Hugging Face checkpoint directory.

`export_hf(location, to)` writes the model's full tensors (whatever layout saved the
checkpoint) as `transformers` does: one `model.safetensors` when the model fits in
`max_shard_size` (default 5 GB), else `model-00001-of-0000N.safetensors` ... and
`model.safetensors.index.json` naming each tensor's file; and the model's
`config.json` (and `generation_config.json`) beside them, so that
`transformers.AutoModelForCausalLM.from_pretrained(to)` loads it. The config comes
from `config=` (a directory holding `config.json`, e.g. the one the job loaded), or
else from what `air.load_pretrained` kept beside the job's checkpoints
(`<checkpoint dir>/hf-config/`).

Memory: the shards are planned from the checkpoint's metadata alone, then read and
written one at a time: this process holds one shard's tensors (at most
`max_shard_size` bytes in the exported dtype; a single tensor bigger than that is a
shard of its own), read from the DCP files in their saved dtype (so twice that when
`dtype` halves them), and never the whole model.

The default is 5 GB, huggingface_hub's and transformers 4's default (transformers 5
raised its own to 50 GB): files the Hub takes, and a bound on what the export holds.

Example:
    >>> from air_sdk.runtime.checkpoint.hf_export import export_hf
    >>> export_hf("/runs/ckpt", "/models/tuned", config="/models/tiny-llama")  # doctest: +SKIP
    Exported(path='/models/tuned', step=300, key='model', num_tensors=12, ...)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from typing import Any

from air_sdk.errors import CheckpointError
from air_sdk.runtime.checkpoint.export import (
    DTYPES,
    Exported,
    hf_names,
    model_entries,
    open_verified,
)
from air_sdk.runtime.hf_weights import CONFIG_FILES, HF_CONFIG_DIR

__all__ = [
    "DEFAULT_MAX_SHARD_SIZE",
    "INDEX_NAME",
    "WEIGHTS_NAME",
    "export_hf",
    "find_config",
    "parse_shard_size",
    "plan_shards",
]

#: the weights file `from_pretrained` looks for first
WEIGHTS_NAME = "model.safetensors"
#: the index of a checkpoint split into shards
INDEX_NAME = "model.safetensors.index.json"
#: huggingface_hub's default (and transformers 4's); see the module docstring
DEFAULT_MAX_SHARD_SIZE = "5GB"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_NO_DIST = r"torch\.distributed is "


def parse_shard_size(size: int | str) -> int:
    """Bytes of a shard size given as transformers takes it: an int, or a string with
    a unit ("5GB" = 5 * 10**9, "500MiB" = 500 * 2**20). CheckpointError says what to
    write otherwise.

    Example:
        >>> parse_shard_size("5GB"), parse_shard_size("2MiB"), parse_shard_size(1000)
        (5000000000, 2097152, 1000)
    """
    number: float
    if isinstance(size, int) and not isinstance(size, bool):
        number, unit = float(size), ""
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
        if found is None or found.group(2).upper() not in _UNITS:
            raise CheckpointError(
                f"max shard size {size!r} is not a size: give bytes or a number with a unit"
                " (KB, MB, GB, KiB, MiB, GiB), e.g. 5GB"
            )
        number, unit = float(found.group(1)), found.group(2).upper()
    total = int(number * _UNITS[unit])
    if total < 1:
        raise CheckpointError(f"max shard size {size!r} is not positive: give e.g. 5GB")
    return total


def plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """The names in `sizes` (in its order) cut into shards of at most `max_bytes` each,
    as huggingface_hub cuts them: a tensor that would overflow the current shard starts
    the next one, and one bigger than `max_bytes` is a shard alone (in order here:
    huggingface_hub puts such a tensor first).

    Example:
        >>> plan_shards({"a": 4, "b": 4, "c": 10, "d": 2}, 8)
        [['a', 'b'], ['c'], ['d']]
    """
    shards: list[list[str]] = []
    current: list[str] = []
    used = 0
    for name, size in sizes.items():
        if current and (size > max_bytes or used + size > max_bytes):
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    if current:
        shards.append(current)
    return shards


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
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Exported:
    """Write the model of checkpoint `step` (default: the newest committed) under
    `location` as the Hugging Face directory `to` (created if missing): its weights in
    shards of at most `max_shard_size` (bytes, or "5GB", "500MiB"; one
    `model.safetensors` when they fit in one) plus the config files. The result's
    `path` is the directory, `shards` the weight files when there are several.

    Refused (CheckpointError) when `to` already holds weights that `from_pretrained`
    would read beside the new ones (an index; `model.safetensors` before a sharded
    export): export to an empty directory.

    Example:
        >>> export_hf("/runs/ckpt", "/models/tuned", max_shard_size="2GB")  # doctest: +SKIP
        Exported(path='/models/tuned', step=300, ..., shards=('model-00001-of-00003.safetensors', ...))
    """
    try:
        import torch
    except ImportError as exc:
        raise CheckpointError(
            f"exporting a checkpoint needs torch and safetensors ({exc}):"
            " pip install 'air-runtime[train]'"
        ) from exc
    if dtype is not None and dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    max_bytes = parse_shard_size(max_shard_size)
    where = os.fspath(location)
    config_dir = find_config(where, config)
    out = os.fspath(to)
    if os.path.exists(out) and not os.path.isdir(out):
        raise CheckpointError(f"{out} is a file: give a directory for --format hf")
    storage, directory, manifest = open_verified(where, step)
    chosen, entries = model_entries(storage, directory, manifest, key)
    tensors, skipped = _tensor_entries(entries, dtype)
    if not tensors:
        raise CheckpointError(f"state[{chosen!r}] of step {manifest.step} holds no tensors")
    sizes = {flat: _out_bytes(meta, dtype) for flat, (_, meta) in tensors.items()}
    shards = plan_shards(sizes, max_bytes)
    names = {flat: new for flat, new in zip(tensors, _names(tensors), strict=True)}
    files = (
        [WEIGHTS_NAME]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    os.makedirs(out, exist_ok=True)
    _refuse_stale(out, sharded=len(shards) > 1)
    metadata = {"format": "pt", "air_step": str(manifest.step), "air_source": directory}
    weight_map: dict[str, str] = {}
    for shard, file in zip(shards, files, strict=True):
        state = _read_shard(storage, directory, shard, torch)
        written = {}
        for flat in shard:
            value = state.pop(flat)  # one tensor in two dtypes at a time, at most
            if dtype is not None and value.is_floating_point():
                value = value.to(getattr(torch, dtype))
            written[names[flat]] = value.contiguous()
            weight_map[names[flat]] = file
        _write_atomic(os.path.join(out, file), _save, written, metadata)
        del written, state
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        # the index last: from_pretrained reads nothing of a half-written export
        text = json.dumps(index, indent=2, sort_keys=True) + "\n"
        _write_atomic(os.path.join(out, INDEX_NAME), _write_text, text)
    for name in CONFIG_FILES:
        source = os.path.join(config_dir, name)
        if os.path.isfile(source):
            shutil.copyfile(source, os.path.join(out, name))
    return Exported(
        path=out,
        step=manifest.step,
        key=chosen,
        num_tensors=len(tensors),
        num_bytes=sum(sizes.values()),
        source=directory,
        skipped=tuple(sorted(skipped)),
        shards=tuple(files) if len(files) > 1 else (),
    )


def _tensor_entries(
    entries: dict[str, tuple[str, Any]], dtype: str | None
) -> tuple[dict[str, tuple[str, Any]], list[str]]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    tensors = {k: v for k, v in entries.items() if isinstance(v[1], TensorStorageMetadata)}
    skipped = [name for k, (name, _) in entries.items() if k not in tensors]
    return tensors, skipped


def _names(tensors: dict[str, tuple[str, Any]]) -> list[str]:
    """The names the unwrapped model has, in `tensors`' order."""
    saved = [name for name, _ in tensors.values()]
    clean = hf_names(saved)
    return [clean[name] for name in saved]


def _out_bytes(meta: Any, dtype: str | None) -> int:
    import torch

    kind = meta.properties.dtype
    if dtype is not None and kind.is_floating_point:
        kind = getattr(torch, dtype)
    return int(meta.size.numel()) * kind.itemsize


def _read_shard(storage: Any, directory: str, flat_keys: list[str], torch: Any) -> dict[str, Any]:
    """{flat key: full tensor} of one shard's tensors, read from the DCP files in this
    process (no process group) and nothing else."""
    from air_sdk.runtime.checkpoint._safe_metadata import load_state

    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST)
        load_state(state, storage.reader(directory), set(flat_keys))
    flat: dict[str, Any] = {}
    _flatten(state, "", flat)
    missing = [k for k in flat_keys if not isinstance(flat.get(k), torch.Tensor)]
    if missing:
        raise CheckpointError(f"the checkpoint at {directory} gave no tensor for {missing[0]}")
    return {k: flat[k] for k in flat_keys}


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    # DCP's flat keys join the nested keys with "."
    if isinstance(value, dict):
        for name, item in value.items():
            _flatten(item, f"{prefix}.{name}" if prefix else str(name), out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}.{i}" if prefix else str(i), out)
    else:
        out[prefix] = value


def _refuse_stale(out: str, *, sharded: bool) -> None:
    """from_pretrained prefers `model.safetensors`, else follows an index: refuse an
    export whose files it would not read, or would read beside old ones."""
    index = os.path.join(out, INDEX_NAME)
    single = os.path.join(out, WEIGHTS_NAME)
    stale = (
        index if os.path.exists(index) else single if sharded and os.path.exists(single) else None
    )
    if stale is not None:
        raise CheckpointError(
            f"{out} holds a Hugging Face checkpoint already ({stale}), which from_pretrained"
            " would read instead of (or beside) this export: export to an empty directory"
        )


def _save(path: str, tensors: dict[str, Any], metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, path, metadata=metadata)


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _write_atomic(path: str, write: Any, *args: Any) -> None:
    """`write(tmp, *args)` beside `path`, then renamed into place."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp, *args)
        os.replace(tmp, path)
    except Exception as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"cannot write {path}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
