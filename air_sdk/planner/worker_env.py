"""What the planner tells every rank of a job: the model's training FLOPs per token
(`AIR_FLOPS_PER_TOKEN`, `WorkerEnv.flops_per_token`), so the runtime's MFU needs no
FLOP counting.

Example:
    >>> from air_sdk.schema import JobSpec, ModelSpec
    >>> flops_per_token(JobSpec(code="pass", model=ModelSpec(preset="gpt2-124m")))
    855383040.0
    >>> flops_per_token(JobSpec(code="pass")) is None
    True
"""

from __future__ import annotations

from air_sdk.planner.search import model_shape
from air_sdk.schema.spec import JobSpec

__all__ = ["flops_per_token"]


def flops_per_token(spec: JobSpec) -> float | None:
    """Training FLOPs per token of `spec.model` (None without one, or for an unknown
    preset)."""
    if spec.model is None:
        return None
    try:
        shape = model_shape(spec.model)
    except ValueError:
        return None
    seq_len = spec.model.seq_len or shape.default_seq_len
    return float(shape.flops_per_token(seq_len))
