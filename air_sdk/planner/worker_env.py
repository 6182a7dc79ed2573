"""What the planner tells every rank of a job: the model's training FLOPs per token
(`AIR_FLOPS_PER_TOKEN`), so the runtime's MFU needs no FLOP counting.

Example:
    >>> from air_sdk.schema import JobSpec, ModelSpec
    >>> worker_env(JobSpec(code="pass", model=ModelSpec(preset="gpt2-124m")))
    {'AIR_FLOPS_PER_TOKEN': '855383040.0'}
    >>> worker_env(JobSpec(code="pass"))
    {}
"""

from __future__ import annotations

from air_sdk.planner.search import model_shape
from air_sdk.schema.spec import FLOPS_PER_TOKEN_ENV, JobSpec

__all__ = ["worker_env"]


def worker_env(spec: JobSpec) -> dict[str, str]:
    """Env for every rank from `spec.model` (empty without one, or for an unknown preset)."""
    if spec.model is None:
        return {}
    try:
        shape = model_shape(spec.model)
    except ValueError:
        return {}
    seq_len = spec.model.seq_len or shape.default_seq_len
    return {FLOPS_PER_TOKEN_ENV: repr(shape.flops_per_token(seq_len))}
