"""Job controllers, failure policies and backends. Reads and writes the store; never HTTP.

Names load on first use: `python -m air_sdk.runner.node` (a node's NodeRunner, one
per job and node) imports this package too, and must not pay for the store, the
scheduler or pydantic before it starts the node's ranks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from air_sdk.runner.backends.local import LocalBackend
    from air_sdk.runner.controller import JobController
    from air_sdk.runner.job_files import JobPaths
    from air_sdk.runner.policy import FailureAction, FailureDecision, RestartPolicy, diagnose
    from air_sdk.runner.retention import RetentionPolicy
    from air_sdk.runner.service import Runner

__all__ = [
    "FailureAction",
    "FailureDecision",
    "JobController",
    "JobPaths",
    "LocalBackend",
    "RestartPolicy",
    "RetentionPolicy",
    "Runner",
    "diagnose",
]

_WHERE = {
    "LocalBackend": "air_sdk.runner.backends.local",
    "JobController": "air_sdk.runner.controller",
    "JobPaths": "air_sdk.runner.job_files",
    "FailureAction": "air_sdk.runner.policy",
    "FailureDecision": "air_sdk.runner.policy",
    "RestartPolicy": "air_sdk.runner.policy",
    "diagnose": "air_sdk.runner.policy",
    "RetentionPolicy": "air_sdk.runner.retention",
    "Runner": "air_sdk.runner.service",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
