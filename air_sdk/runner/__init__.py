"""Job controllers, failure policies and backends. Reads and writes the store; never HTTP."""

from air_sdk.runner.backends.local import LocalBackend
from air_sdk.runner.controller import JobController, JobPaths
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
