"""Reading a checkpoint a job wrote, outside the job's sandbox, without running its code.

DCP's `FileSystemReader.read_metadata` is a plain `pickle.load` of `.metadata`, and
its planner's `load_bytes` a `torch.load(weights_only=False)` of every non-tensor
entry: both run whatever the pickle says. A job writes its own checkpoint (and can
make its manifest's sha256 match), so `air checkpoints export` on a user's machine ran
the job's code there (issue 19). Here `.metadata` is read by an unpickler that builds
only DCP's metadata classes and the few values they hold, and non-tensor entries go
through `torch.load(weights_only=True)`; anything else is a `CheckpointError`.

Example:
    >>> import io, pickle
    >>> class Boom:
    ...     def __reduce__(self):
    ...         return (print, ("ran the job's code",))
    >>> load_metadata(io.BytesIO(pickle.dumps(Boom())), "ckpt/step-3")
    Traceback (most recent call last):
    ...
    air_sdk.errors.CheckpointError: ckpt/step-3/.metadata is not DCP metadata: it asks for builtins.print, which a checkpoint's metadata never holds; export refuses to run code a job wrote (re-save the checkpoint with air_sdk.runtime.checkpoint)
"""

from __future__ import annotations

import io
import pickle
from typing import IO, TYPE_CHECKING, Any

from air_sdk.errors import CheckpointError

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageReader
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["SafeLoadPlanner", "load_metadata", "load_state", "safe_reader"]

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
#: (module, name) of every global a DCP `.metadata` needs (torch 2.4-2.13)
_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        *(
            (_DCP_METADATA, name)
            for name in (
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "Metadata",
                "MetadataIndex",
                "StorageMeta",
                "TensorProperties",
                "TensorStorageMetadata",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata and nothing else: every global outside `_ALLOWED` (and torch's
    dtypes) is refused before it is looked up."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        raise pickle.UnpicklingError(f"{module}.{name}")


def load_metadata(stream: IO[bytes], where: str) -> Metadata:
    """The DCP `Metadata` pickled in `stream` (the `.metadata` of checkpoint `where`),
    built by an unpickler that allows only DCP's metadata classes: a `CheckpointError`
    saying so for anything else."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        found = _MetadataUnpickler(stream).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{where}/.metadata is not DCP metadata: it asks for {exc}, which a"
            " checkpoint's metadata never holds; export refuses to run code a job wrote"
            " (re-save the checkpoint with air_sdk.runtime.checkpoint)"
        ) from None
    except (EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{where}/.metadata cannot be read: {exc}") from None
    if not isinstance(found, Metadata):
        raise CheckpointError(f"{where}/.metadata holds a {type(found).__name__}, not DCP metadata")
    return found


def safe_reader(reader: StorageReader) -> StorageReader:
    """`reader` (a DCP `FileSystemReader`, local or fsspec) whose `read_metadata` uses
    `load_metadata` instead of `pickle.load`; DCP's loader calls it too.

    Example:
        >>> from torch.distributed.checkpoint import FileSystemReader  # doctest: +SKIP
        >>> safe_reader(FileSystemReader("ckpt/step-3")).read_metadata()  # doctest: +SKIP
    """
    from torch.distributed.checkpoint.metadata import StorageMeta

    fs, path = reader.fs, reader.path  # type: ignore[attr-defined]

    def read_metadata(*args: Any, **kwargs: Any) -> Metadata:
        with fs.create_stream(fs.concat_path(path, ".metadata"), "rb") as stream:
            metadata = load_metadata(stream, str(path))
        meta = getattr(metadata, "storage_meta", None)
        if meta is None:
            meta = metadata.storage_meta = StorageMeta()
        meta.load_id = getattr(reader, "load_id", None)
        return metadata

    reader.read_metadata = read_metadata  # type: ignore[method-assign]
    return reader


def _planner_base() -> type:
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    return _EmptyStateDictLoadPlanner


class SafeLoadPlanner(_planner_base()):  # type: ignore[misc]
    """DCP's planner for loading a state without a template, whose non-tensor entries
    are read with `torch.load(weights_only=True)`: plain values load, a pickle that
    would run code is a `CheckpointError`."""

    #: the refusal raised inside DCP's loader, which wraps it (`load_state` re-raises it)
    refusal: CheckpointError | None = None

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        import torch

        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            # DCP wraps what a planner raises (CheckpointException): `load_state` finds it
            self.refusal = CheckpointError(
                f"the checkpoint entry {read_item.dest_index.fqn!r} is not plain data"
                f" ({str(exc).splitlines()[0]}); export refuses to run code a job wrote"
            )
            raise self.refusal from None
        safe = io.BytesIO()
        torch.save(loaded, safe)  # our own bytes of plain data, for DCP's own loader
        safe.seek(0)
        super().load_bytes(read_item, safe)


def load_state(state: dict[str, Any], reader: StorageReader, keys: set[str]) -> None:
    """Load the entries `keys` of the checkpoint `reader` reads into `state`, in this
    process and with no collective (what DCP's own `dcp_to_torch_save` does), through
    `safe_reader` and `SafeLoadPlanner`; a refusal is a `CheckpointError`, not DCP's
    `CheckpointException` (a BaseException) around it.

    Example:
        >>> load_state(state, FileSystemReader("ckpt/step-3"), {"model"})  # doctest: +SKIP
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    planner = SafeLoadPlanner(keys=keys)
    reader = safe_reader(reader)
    try:
        reader.read_metadata()  # refused here, before DCP would wrap the refusal
        _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
    except CheckpointException as exc:
        if planner.refusal is not None:
            raise planner.refusal from None
        raise CheckpointError(f"the checkpoint cannot be read: {exc}") from None
