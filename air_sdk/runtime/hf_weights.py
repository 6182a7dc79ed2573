"""Hugging Face safetensors weights straight into a parallelized model, and back out.

`load_pretrained(model, directory)` reads a `transformers` checkpoint directory
(`model.safetensors`, or `model.safetensors.index.json` and its shards) into the
model's parameters however they are sharded (FSDP2 and TP DTensors, a pipeline's
stage modules): torch's `HuggingFaceStorageReader` under `torch.distributed.checkpoint.load`,
on the model's sharded state dict (`get_model_state_dict`), so each rank reads only
the slices it holds and no rank builds the whole model. Names: the file's are the
`transformers` model's own; a base model (`LlamaModel`) also reads a head model's file
(`model.` prefix) and the reverse; a head tied to the embedding (`tie_word_embeddings`,
no `lm_head.weight` in the file) takes the embedding's weights.

`save_pretrained(model, directory)` is the reverse, from the job itself: every rank
writes its shards (`HuggingFaceStorageWriter`), rank 0 joins them into
`model.safetensors` and writes the `config.json` the model came with.

Example:
    >>> import air_sdk.runtime as air
    >>> model = air.parallelize(LlamaForCausalLM(config))  # doctest: +SKIP
    >>> air.load_pretrained(model, "/models/tiny-llama")  # doctest: +SKIP
    Pretrained(directory='/models/tiny-llama', num_tensors=12, tied=(), ...)
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from air_sdk.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    import torch.nn as nn

__all__ = ["CONFIG_FILES", "Pretrained", "load_pretrained", "save_pretrained"]

#: files of a transformers checkpoint directory copied beside exported weights
CONFIG_FILES = ("config.json", "generation_config.json")
_NO_DIST = r"torch\.distributed is "


@dataclass(frozen=True)
class Pretrained:
    """What `load_pretrained` read."""

    directory: str
    num_tensors: int
    #: model names filled from another name of the file (a tied head from the embedding)
    tied: tuple[str, ...] = ()
    #: tensors of the file no module of the model (or of this rank's stages) holds
    unused: tuple[str, ...] = ()


def _parts(model: Any) -> list[nn.Module]:
    """The modules to fill: a model, a `Pipeline`'s stage modules, or a list of them."""
    import torch.nn as nn

    if isinstance(model, nn.Module):
        return [model]
    parts = getattr(model, "model_parts", model)
    if isinstance(parts, Iterable):
        found = list(parts)
        if found and all(isinstance(p, nn.Module) for p in found):
            return found
    raise ConfigError(
        f"load_pretrained takes an nn.Module, an air.pipeline(...) or a list of stage"
        f" modules, not {type(model).__name__}"
    )


def _directory(path: str | os.PathLike[str]) -> str:
    path = os.fspath(path)
    if os.path.isfile(path):
        directory = os.path.dirname(os.path.abspath(path))
        others = [f for f in os.listdir(directory) if f.endswith(".safetensors")]
        if others != [os.path.basename(path)]:
            raise ConfigError(
                f"{path} shares its directory with other safetensors files ({len(others)}"
                " in all): give the checkpoint's directory, which holds one model"
            )
        return directory
    if not os.path.isdir(path) or not any(f.endswith(".safetensors") for f in os.listdir(path)):
        raise ConfigError(
            f"{path} is not a Hugging Face checkpoint directory (no *.safetensors in it):"
            " give the directory save_pretrained wrote (model.safetensors, or"
            " model.safetensors.index.json and its shards)"
        )
    return path


def _materialize(part: nn.Module) -> None:
    """Give parameters built on the meta device real (uninitialized) storage; their
    values come from the file. Buffers no file holds (rotary tables, computed in
    `__init__`) are computed again by the `transformers` model's own `_init_weights`;
    other such buffers on meta are refused."""
    import torch

    if not any(t.is_meta for t in part.parameters()):
        return
    persistent = set(part.state_dict())
    owners = {}
    for module_name, module in part.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if buffer is not None and buffer.is_meta and full not in persistent:
                owners[full] = module
    rebuild = getattr(part, "_init_weights", None)
    unknown = [
        n for n, m in owners.items() if rebuild is None or "RotaryEmbedding" not in type(m).__name__
    ]
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown[:3])} are buffers on the meta device that no checkpoint"
            " holds (computed in __init__): build them on a real device, or compute them"
            " again after load_pretrained"
        )
    device = next((t.device for t in part.parameters() if not t.is_meta), None) or torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"
    )
    part.to_empty(device=device)
    with torch.no_grad():
        for module in {id(m): m for m in owners.values()}.values():
            assert rebuild is not None
            rebuild(module)


def _file_names(model_names: Iterable[str], file_names: set[str], prefix: str) -> dict[str, str]:
    """{model name: file name}, trying the name as it is, then with the base model's
    prefix added or dropped."""
    found: dict[str, str] = {}
    for name in model_names:
        candidates = [name]
        if prefix:
            candidates += [f"{prefix}.{name}", name.removeprefix(f"{prefix}.")]
        hit = next((c for c in candidates if c in file_names), None)
        if hit is not None:
            found[name] = hit
    return found


def _tied_source(part: nn.Module, name: str, file_tied: bool = False) -> str | None:
    """The name of the embedding weight `name` is tied to, when `name` is the output
    head's weight: tied by the model's config, by being one parameter, or by the
    checkpoint's config (`file_tied`: a head untied for a pipeline, whose file holds
    only the embedding). A pipeline stage that dropped the embedding still names it."""
    config = getattr(part, "config", None)
    head = getattr(part, "get_output_embeddings", lambda: None)()
    embeddings = getattr(part, "get_input_embeddings", lambda: None)()
    if head is None or embeddings is None:
        return None
    names = {id(m): n for n, m in part.named_modules()}
    head_name, emb_name = names.get(id(head)), names.get(id(embeddings))
    if head_name is None or emb_name is None or name != f"{head_name}.weight":
        return None
    head_weight, weight = getattr(head, "weight", None), getattr(embeddings, "weight", None)
    if head_weight is None:  # a pipeline stage dropped the head
        return None
    one = weight is not None and head_weight is weight
    tied = getattr(config, "tie_word_embeddings", False) or one or file_tied
    return f"{emb_name}.weight" if tied else None


def _file_ties(directory: str) -> bool:
    """Whether the checkpoint's own config.json ties its head to the embedding."""
    try:
        with open(os.path.join(directory, "config.json")) as f:
            return bool(json.load(f).get("tie_word_embeddings", False))
    except (OSError, ValueError, AttributeError):
        return False


def load_pretrained(model: Any, path: str | os.PathLike[str]) -> Pretrained:
    """Fill `model`'s parameters and persistent buffers from the safetensors checkpoint
    at `path` (a directory, or its one `model.safetensors`), each rank reading only its
    own shards. Call it after `air.parallelize` / `air.pipeline` (on the result:
    the model, or the `Pipeline`), on every rank; parameters still on the meta device
    are given storage first (`to_empty`).

    Raises ConfigError when the directory holds no safetensors or the model has a
    tensor the file lacks (the names and where they differ), CheckpointError when a
    shape differs.

    Example:
        >>> model = air.parallelize(LlamaForCausalLM(config))  # doctest: +SKIP
        >>> air.load_pretrained(model, "/models/tiny-llama").num_tensors  # doctest: +SKIP
        12
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    directory = _directory(path)
    file_names = set(HuggingFaceStorageReader(directory).read_metadata().state_dict_metadata)
    total, tied, used = 0, [], set()
    file_tied = _file_ties(directory)
    for part in _parts(model):
        _materialize(part)
        state = get_model_state_dict(part)
        prefix = getattr(part, "base_model_prefix", "")
        names = _file_names(state, file_names, prefix)
        to_load = {names[n]: t for n, t in state.items() if n in names}
        seen = {id(t) for t in to_load.values()}
        missing = []
        for name, tensor in state.items():
            if name in names:
                continue
            source = _tied_source(part, name, file_tied)
            found = {} if source is None else _file_names([source], file_names, prefix)
            if source in found:
                tied.append(name)
                if id(tensor) not in seen:  # untied (by sharding, by a pipeline stage)
                    missing.append((name, found[source]))
                continue
            raise ConfigError(
                f"{name} of {type(part).__name__} is not in {directory} (it holds e.g."
                f" {', '.join(sorted(file_names)[:4])}): load a checkpoint of this model's"
                " architecture and config"
            )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NO_DIST)
            _read(dcp, to_load, directory)
            # the tied head's own copy, from the embedding; a collective (DCP plans over
            # all ranks), so every rank reads, with nothing to read on most of them (a
            # pipeline's last stage alone holds an untied head)
            _read(dcp, {source: state[name] for name, source in missing}, directory)
        set_model_state_dict(part, state, options=StateDictOptions(strict=False))
        total += len(to_load)
        used |= set(to_load) | {source for _, source in missing}
    _remember_config(directory)
    return Pretrained(
        directory=directory,
        num_tensors=total,
        tied=tuple(sorted(set(tied))),
        unused=tuple(sorted(file_names - used)),
    )


def _read(dcp: Any, state: dict[str, Any], directory: str) -> None:
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    try:
        dcp.load(state, storage_reader=HuggingFaceStorageReader(directory))
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise CheckpointError(f"reading {directory} into the model failed: {exc}") from exc


def _remember_config(directory: str) -> None:
    """Keep the loaded model's config beside the job's checkpoints (rank 0), so that
    `air checkpoints export --format hf` writes a directory `from_pretrained` loads."""
    from air_sdk.runtime._context import context

    ctx = context()
    if ctx.checkpoint_dir is None or ctx.rank != 0 or "://" in ctx.checkpoint_dir:
        return
    target = os.path.join(ctx.checkpoint_dir, HF_CONFIG_DIR)
    os.makedirs(target, exist_ok=True)
    for name in CONFIG_FILES:
        source = os.path.join(directory, name)
        if os.path.isfile(source):
            shutil.copyfile(source, os.path.join(target, name))


#: where `load_pretrained` keeps the config under a job's checkpoint directory
HF_CONFIG_DIR = "hf-config"


def save_pretrained(
    model: Any, directory: str | os.PathLike[str], *, config_from: str | None = None
) -> str:
    """Write `model` (sharded any way; a `Pipeline` too) as a Hugging Face checkpoint
    directory: every rank writes its own shards, rank 0 joins them into
    `model.safetensors` and copies `config.json` (from `config_from`, else the model's
    `config.save_pretrained`). Call it on every rank. Returns the directory.

    Example:
        >>> air.save_pretrained(model, air.output_dir() / "hf")  # doctest: +SKIP
        '/outputs/hf'
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    out = os.fspath(directory)
    parts = _parts(model)
    state: dict[str, Any] = {}
    for part in parts:
        state.update(get_model_state_dict(part))
    for part in parts:  # a tied head is saved once, as transformers does
        for name in list(state):
            source = _tied_source(part, name)
            if source is not None and source in state and name != source:
                del state[name]
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    writer = HuggingFaceStorageWriter(
        out, save_distributed=distributed, enable_consolidation=distributed
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST)
        dcp.save(state, storage_writer=writer)
    rank = dist.get_rank() if distributed else 0
    if rank == 0:
        _write_config(parts[0], out, config_from)
        shutil.rmtree(os.path.join(out, "sharded"), ignore_errors=True)
    if distributed:
        dist.barrier()
    return out


def _write_config(part: nn.Module, out: str, config_from: str | None) -> None:
    if config_from is not None:
        for name in CONFIG_FILES:
            source = os.path.join(config_from, name)
            if os.path.isfile(source):
                shutil.copyfile(source, os.path.join(out, name))
        return
    save = getattr(getattr(part, "config", None), "save_pretrained", None)
    if callable(save):
        save(out)
    elif not os.path.exists(os.path.join(out, "config.json")):
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump({}, f)
