"""A committed checkpoint's model as one safetensors file of full tensors.

`export_safetensors(location, to)` reads a checkpoint however it was sharded (DDP,
FSDP2, TP, pipeline stages, any world size) in this one process, without a process
group: DCP assembles every tensor whole from the ranks' files. The file holds the
model's parameter names as the unwrapped model has them (`model.state_dict()` of
the plain module: no `module.`, `_orig_mod.`, `_checkpoint_wrapped_module.`), so
`safetensors.torch.load_file` + `load_state_dict`, or Hugging Face `from_pretrained`
for a model whose names match, reads it. Only the model: optimizer state and plain
values stay behind. The whole model is held in memory once.

The checkpoint is verified against its manifest (sizes and sha256) before anything
is written; the file is written beside its target and renamed into place.

Example:
    >>> from air_sdk.runtime.checkpoint.export import export_safetensors
    >>> export_safetensors("/runs/ckpt", "model.safetensors", step=300)  # doctest: +SKIP
    Exported(path='model.safetensors', step=300, key='model', num_tensors=12, ...)
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from air_sdk.errors import CheckpointError
from air_sdk.runtime._manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    read_manifest,
    verify_files,
)
from air_sdk.runtime._storage import CheckpointStorage, storage_for
from air_sdk.runtime.checkpoint._commit import latest_committed

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPES",
    "Exported",
    "export_safetensors",
    "find_checkpoint",
    "hf_names",
    "model_entries",
    "open_verified",
]

#: wrapper modules whose name appears in a parameter's path: torch.compile,
#: activation checkpointing, FSDP1; DDP's `module.` only as the first part
_WRAPPER_PARTS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
#: `dtype=` names and what they cast floating tensors to
DTYPES = ("float32", "bfloat16", "float16")
_NO_DIST = r"torch\.distributed is "


@dataclass(frozen=True)
class Exported:
    """What `export_safetensors` wrote."""

    path: str
    step: int
    key: str
    num_tensors: int
    num_bytes: int
    source: str
    #: saved under the model's key but not tensors (e.g. a module's `_extra_state`)
    skipped: tuple[str, ...] = field(default_factory=tuple)
    #: the weight files written, for a Hugging Face export split into shards (their
    #: `model.safetensors.index.json` beside them); empty for one file
    shards: tuple[str, ...] = field(default_factory=tuple)


def hf_names(names: list[str]) -> dict[str, str]:
    """{saved name: the name the unwrapped model has} (wrapper parts dropped).

    Example:
        >>> hf_names(["module._orig_mod.layers.0._checkpoint_wrapped_module.w1.weight"])
        {'module._orig_mod.layers.0._checkpoint_wrapped_module.w1.weight': 'layers.0.w1.weight'}
    """
    out: dict[str, str] = {}
    taken: dict[str, str] = {}
    for name in names:
        parts = name.split(".")
        if parts and parts[0] == "module" and len(parts) > 1:
            parts = parts[1:]
        clean = ".".join(p for p in parts if p not in _WRAPPER_PARTS)
        if clean in taken:
            raise CheckpointError(
                f"{taken[clean]!r} and {name!r} are both {clean!r} once wrapper names are"
                " dropped; the checkpoint holds two models under one key"
            )
        taken[clean] = name
        out[name] = clean
    return out


def find_checkpoint(
    location: str | os.PathLike[str], step: int | None
) -> tuple[CheckpointStorage, str, int]:
    """(storage, step directory, step) for `location`: a checkpoint directory
    (`.../step-N` with its manifest) or a root holding `step-N` directories, where
    `step=None` takes the newest committed. CheckpointError says what is missing.

    Example:
        >>> find_checkpoint("/tmp/air-no-such-ckpt", None)
        Traceback (most recent call last):
        ...
        air_sdk.errors.CheckpointError: no committed checkpoint under /tmp/air-no-such-ckpt
    """
    storage: CheckpointStorage = storage_for(location)
    root = storage.root
    try:
        own = read_manifest(storage, root)
    except (ManifestError, OSError) as exc:
        raise CheckpointError(f"{storage.join(root, MANIFEST_NAME)} is not valid: {exc}") from exc
    if own is not None:  # a step directory itself
        if step is not None and own.step != step:
            raise CheckpointError(f"{root} holds step {own.step}, not step {step}")
        return storage, root, own.step
    if step is None:
        try:
            found = latest_committed(storage)
        except OSError as exc:
            raise CheckpointError(f"cannot list {root}: {exc}") from exc
        if found is None:
            raise CheckpointError(f"no committed checkpoint under {root}")
        step = found
    directory = storage.join(root, f"step-{step}")
    try:
        manifest = read_manifest(storage, directory)
    except (ManifestError, OSError) as exc:
        raise CheckpointError(
            f"{storage.join(directory, MANIFEST_NAME)} is not valid: {exc}"
        ) from exc
    if manifest is None or manifest.step != step:
        newest = latest_committed(storage)
        hint = f" (the newest is step {newest})" if newest is not None else ""
        raise CheckpointError(f"no committed checkpoint of step {step} under {root}{hint}")
    return storage, directory, step


def _model_key(manifest: Manifest, top_level: set[str], key: str | None, where: str) -> str:
    if manifest.state_kinds is not None:
        models = sorted(k for k, kind in manifest.state_kinds.items() if kind == "model")
    else:  # a checkpoint from before the manifest said which keys are models
        models = ["model"] if "model" in top_level else []
    if key is not None:
        if key not in top_level:
            raise CheckpointError(
                f"{where} has no key {key!r}; it has {', '.join(sorted(top_level))}"
            )
        return key
    if len(models) == 1:
        return models[0]
    if models:
        raise CheckpointError(
            f"{where} holds several models ({', '.join(models)}): say which one (key=/--key)"
        )
    raise CheckpointError(
        f"{where} records no model; its keys are {', '.join(sorted(top_level))}:"
        " say which one holds the model's tensors (key=/--key)"
    )


def _leaves(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for name, item in value.items():
            _leaves(item, f"{prefix}.{name}" if prefix else str(name), out)
    else:
        out[prefix] = value


def export_safetensors(
    location: str | os.PathLike[str],
    to: str | os.PathLike[str],
    *,
    step: int | None = None,
    key: str | None = None,
    dtype: str | None = None,
) -> Exported:
    """Write the model of checkpoint `step` (default: the newest committed) under
    `location` (a local path or fsspec URL: a checkpoint root or one `step-N`
    directory) to the safetensors file `to`, as full tensors named as the unwrapped
    model names them. `key` picks the state entry (default: the one model the
    manifest records); `dtype` (`DTYPES`) casts floating tensors.

    Example:
        >>> export_safetensors("/runs/ckpt", "model.safetensors")  # doctest: +SKIP
        Exported(path='model.safetensors', step=300, key='model', ...)
    """
    try:
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import save_file
    except ImportError as exc:
        raise CheckpointError(
            f"exporting a checkpoint needs torch and safetensors ({exc}):"
            " pip install 'air-runtime[train]'"
        ) from exc
    if dtype is not None and dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    parent = os.path.dirname(os.path.abspath(os.fspath(to)))
    if not os.path.isdir(parent):
        raise CheckpointError(
            f"cannot write {os.fspath(to)}: the directory {parent} does not exist"
        )
    storage, directory, manifest = open_verified(location, step)
    step = manifest.step
    chosen, values = _read_model(storage, directory, manifest, key)
    names = hf_names(sorted(values))
    out: dict[str, torch.Tensor] = {}
    skipped = []
    for name, value in values.items():
        if not isinstance(value, torch.Tensor):
            skipped.append(name)
            continue
        if dtype is not None and value.is_floating_point():
            value = value.to(getattr(torch, dtype))
        out[names[name]] = value.contiguous()
    if not out:
        raise CheckpointError(f"state[{chosen!r}] of step {step} holds no tensors")
    path = os.fspath(to)
    tmp = f"{path}.tmp-{os.getpid()}"
    metadata = {"format": "pt", "air_step": str(step), "air_source": directory}
    try:
        save_file(out, tmp, metadata=metadata)
        os.replace(tmp, path)
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot write {path}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return Exported(
        path=path,
        step=step,
        key=chosen,
        num_tensors=len(out),
        num_bytes=sum(t.numel() * t.element_size() for t in out.values()),
        source=directory,
        skipped=tuple(sorted(skipped)),
    )


def open_verified(
    location: str | os.PathLike[str], step: int | None
) -> tuple[CheckpointStorage, str, Manifest]:
    """(storage, step directory, manifest) of checkpoint `step` (default: the newest
    committed) under `location`, its files checked against the manifest (sizes and
    sha256). CheckpointError names the first file that differs."""
    storage, directory, step = find_checkpoint(location, step)
    manifest = read_manifest(storage, directory)
    assert manifest is not None
    problems = verify_files(storage, directory, manifest.files)
    if problems:
        more = f" (and {len(problems) - 1} more)" if problems[1:] else ""
        raise CheckpointError(
            f"checkpoint step {step} at {directory} does not match its manifest:"
            f" {problems[0]}{more}; export another step"
        )
    return storage, directory, manifest


def model_entries(
    storage: CheckpointStorage, directory: str, manifest: Manifest, key: str | None
) -> tuple[str, dict[str, tuple[str, Any]]]:
    """(the model's key, {DCP's flat key: (saved name under the model, its DCP storage
    metadata)}) in the order the checkpoint saved them, from the metadata alone (no
    tensor is read): what a reader of one part of the model at a time plans with."""
    # a job wrote these files: nothing of them is unpickled but DCP's metadata classes
    from air_sdk.runtime.checkpoint._safe_metadata import safe_reader

    metadata = safe_reader(storage.reader(directory)).read_metadata()
    planner_data = metadata.planner_data or {}
    paths = {
        k: tuple(str(p) for p in planner_data.get(k, k.split(".", 1)))
        for k in metadata.state_dict_metadata
    }
    top_level = {path[0] for path in paths.values()}
    chosen = _model_key(manifest, top_level, key, f"checkpoint step {manifest.step}")
    return chosen, {
        k: (".".join(paths[k][1:]), meta)
        for k, meta in metadata.state_dict_metadata.items()
        if paths[k][0] == chosen
    }


def _read_model(
    storage: CheckpointStorage, directory: str, manifest: Manifest, key: str | None
) -> tuple[str, dict[str, Any]]:
    """(the key read, {saved name: value}) of the model entry, whole, in this process."""
    from air_sdk.runtime.checkpoint._safe_metadata import load_state

    chosen, _ = model_entries(storage, directory, manifest, key)
    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST)
        # One process, no collective, whatever this process's torch.distributed state:
        # what DCP's own dcp_to_torch_save does, cut to one key.
        load_state(state, storage.reader(directory), {chosen})
    values: dict[str, Any] = {}
    _leaves(state.get(chosen, {}), "", values)
    return chosen, values
