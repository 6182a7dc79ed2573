"""AIR: multi-node PyTorch training from a notebook, a script or the `air` CLI.

Example:
    >>> import air_sdk
    >>> air_sdk.JobSpec(entrypoint="train.py").resources.nodes
    1
"""

from air_sdk.errors import AirError
from air_sdk.schema import JobSnapshot, JobSpec, JobState, Resources

__version__ = "0.1.0"

__all__ = [
    "AirError",
    "Client",
    "Job",
    "JobSnapshot",
    "JobSpec",
    "JobState",
    "Resources",
    "__version__",
]


def __getattr__(name: str) -> object:
    # Lazy so `import air_sdk` stays light (no requests/tenacity until a client is made).
    if name in ("Client", "Job"):
        from air_sdk import client

        return getattr(client, name)
    raise AttributeError(f"module 'air_sdk' has no attribute {name!r}")
