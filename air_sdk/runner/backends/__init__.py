"""Backends: how an attempt's nodes are started, watched and stopped (local; ray later)."""

from air_sdk.runner.backends.base import Backend, LaunchRequest, NodeStatus
from air_sdk.runner.backends.local import LocalBackend

__all__ = ["Backend", "LaunchRequest", "LocalBackend", "NodeStatus"]
