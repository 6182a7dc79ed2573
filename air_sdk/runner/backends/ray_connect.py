"""Joining a Ray cluster as the gateway's driver, with Ray's token auth (on by default
since Ray 2.60). Ray is imported here only, lazily.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.ray_rules import auth_env

__all__ = ["connect", "reload_ray_config"]

log = logging.getLogger(__name__)


def connect(address: str, namespace: str, init_kwargs: dict[str, Any]) -> None:
    """`ray.init` on `address` unless this process already joined; a refused join says
    how to give the gateway the cluster's token.

    Example:
        >>> connect("ray://head:10001", "air", {})  # doctest: +SKIP
    """
    extra, source = auth_env(os.environ)
    os.environ.update(extra)  # before Ray reads its config: token mode on when a token is there
    import ray

    if extra:
        reload_ray_config()
    if ray.is_initialized():
        return
    try:
        ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
            **init_kwargs,
        )
    except Exception as exc:
        raise ConfigError(
            f"cannot join the Ray cluster at {address}: {exc}. Ray's token auth is on by"
            " default since 2.60: give the gateway the cluster's token with RAY_AUTH_TOKEN or"
            f" RAY_AUTH_TOKEN_PATH (`ray get-auth-token` on the head node prints it); {source}"
        ) from exc
    log.info("joined the Ray cluster at %s (%s)", address, source)


def reload_ray_config() -> None:
    """Make a Ray imported earlier in this process see RAY_AUTH_MODE (as `ray start` does)."""
    try:
        from ray._raylet import (  # type: ignore[attr-defined]
            AuthenticationTokenLoader,
            Config,
        )

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception as exc:  # private API: without it, a fresh process still works
        log.debug("could not reload Ray's config: %s", exc)
