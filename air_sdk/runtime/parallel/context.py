"""`context_parallel()`: torch's context parallelism (ring attention for SDPA) over the
mesh's `cp` dim, on GPUs only.

Inside the context, `F.scaled_dot_product_attention` runs as ring attention across the
cp ranks and the given buffers (inputs, targets, rotary tables) hold this rank's part of
the sequence. torch implements the ring for the CUDA kernels (flash, memory-efficient,
cuDNN); on CPU, SDPA dispatches to `_scaled_dot_product_flash_attention_for_cpu`, which
has no ring handler, so each rank would attend only within its own chunk: AIR refuses
instead of training a wrong model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from air_sdk.errors import ConfigError
from air_sdk.runtime.parallel.meshes import layout_of, submesh

__all__ = ["context_parallel"]


@contextlib.contextmanager
def context_parallel(
    *buffers: torch.Tensor,
    seq_dims: Sequence[int] | None = None,
    no_restore: Sequence[torch.Tensor] = (),
    mesh: DeviceMesh | None = None,
) -> Iterator[None]:
    """Run the block with context parallelism over the mesh's `cp` ranks (GPUs only).

    `buffers` (tokens, targets, a rotary table: no parameters) are sharded in place
    along `seq_dims` (default: dim 1 for each) for the block and restored after it,
    except those in `no_restore`. With cp=1 the block runs as is. Sequence lengths
    must be multiples of 2 x cp (torch balances the causal load in 2 x cp chunks).

    Raises ConfigError on a CPU mesh: torch's ring attention exists only for the CUDA
    SDPA kernels.

    Example:
        >>> import air_sdk.runtime as air
        >>> with air.context_parallel(tokens, targets, model.rope, seq_dims=[1, 1, 0]):  # doctest: +SKIP
        ...     loss = loss_fn(model(tokens), targets)
        ...     loss.backward()
    """
    if mesh is None:
        from air_sdk.runtime.parallel.meshes import mesh as current_mesh

        mesh = current_mesh()
    if seq_dims is not None and len(seq_dims) != len(buffers):
        raise ConfigError(
            f"{len(buffers)} buffers but {len(seq_dims)} seq_dims: give one per buffer"
        )
    cp = layout_of(mesh).cp
    if mesh.device_type != "cuda":
        raise ConfigError(
            f"context parallelism (cp={cp}) runs only on GPUs: torch's ring attention"
            " handles the CUDA SDPA kernels, and on CPU each rank would attend only to its"
            " own chunk of the sequence; on CPU keep cp=1 and run without"
            " air.context_parallel(...)"
        )
    if cp == 1:
        yield
        return
    from torch.distributed.tensor.experimental import context_parallel as torch_cp

    dims = list(seq_dims) if seq_dims is not None else [1] * len(buffers)
    with torch_cp(
        submesh("cp", mesh),
        buffers=list(buffers),
        buffer_seq_dims=dims,
        no_restore_buffers=set(no_restore),
    ):
        yield
