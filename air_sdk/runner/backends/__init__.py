"""Backends: how an attempt's nodes are started, watched and stopped (local, ray).

`RayBackend` is loaded on first use, so importing the runner never imports Ray.
"""

from typing import TYPE_CHECKING, Any

from air_sdk.runner.backends.base import Backend, LaunchRequest, NodeStatus
from air_sdk.runner.backends.local import LocalBackend

if TYPE_CHECKING:
    from air_sdk.runner.backends.ray import RayBackend

__all__ = ["Backend", "LaunchRequest", "LocalBackend", "NodeStatus", "RayBackend"]


def __getattr__(name: str) -> Any:
    if name == "RayBackend":
        from air_sdk.runner.backends.ray import RayBackend

        return RayBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
