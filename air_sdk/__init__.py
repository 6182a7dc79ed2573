"""AIR: multi-node PyTorch training from a notebook, a script or the `air` CLI.

Example:
    >>> import air_sdk
    >>> air_sdk.JobSpec(entrypoint="train.py").resources.nodes
    1
    >>> @air_sdk.distributed(nodes=2)
    ... def train(epochs: int) -> float:
    ...     return 0.0
    >>> train(3)  # doctest: +SKIP
    0.0
"""

from air_sdk.errors import AirError

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
    "checkpoints",
    "distributed",
    "plan",
]


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext air_sdk`: registers the `%air` / `%%air` magics (see `magics`).

    Example:
        >>> air_sdk.load_ipython_extension(get_ipython())  # doctest: +SKIP
    """
    # Imported here: `import air_sdk` must not load IPython.
    from magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> object:
    # Lazy so `import air_sdk` (and so every subpackage, e.g. the rank supervisor)
    # stays light: no pydantic, requests or tenacity until they are used.
    if name in ("Client", "Job"):
        from air_sdk import client

        return getattr(client, name)
    if name == "checkpoints":  # a submodule: `air_sdk.checkpoints.export(...)`
        import importlib

        return importlib.import_module("air_sdk.checkpoints")
    if name == "plan":  # the memory and layout planner: pure arithmetic, no torch
        from air_sdk.planner import plan

        return plan
    if name == "distributed":  # loads cloudpickle and the client on first use
        from air_sdk.notebook.function import distributed

        return distributed
    if name in ("JobSnapshot", "JobSpec", "JobState", "Resources"):
        from air_sdk import schema

        return getattr(schema, name)
    raise AttributeError(f"module 'air_sdk' has no attribute {name!r}")
