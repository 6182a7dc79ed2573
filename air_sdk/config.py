"""Settings: `~/.config/air/config.toml`, overridden by `AIR_*` env vars.

Client side (CLI, SDK, magics):

    gateway_url = "http://127.0.0.1:8470"
    token = "air_..."

The embedded gateway writes this file on its first start, so a newcomer types
nothing. `AIR_CONFIG_FILE` points elsewhere (tests use it); `AIR_HOME` is where
the embedded gateway keeps its database, bundles and job directories.

Example:
    >>> ClientSettings(gateway_url="http://127.0.0.1:9", token="t").gateway_url
    'http://127.0.0.1:9'
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from air_sdk.errors import ConfigError

DEFAULT_PORT = 8470
DEFAULT_GATEWAY_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


def config_file() -> Path:
    """The client config file: `$AIR_CONFIG_FILE` or `~/.config/air/config.toml`."""
    explicit = os.environ.get("AIR_CONFIG_FILE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "air" / "config.toml"


def configured_gateway_port() -> int | None:
    """The port $AIR_GATEWAY_URL names when it points at this machine (an embedded
    gateway starts where clients will look for it), else None: the default port, or
    the next free one when something else holds it.

    Example:
        >>> os.environ["AIR_GATEWAY_URL"] = "http://127.0.0.1:9123"
        >>> configured_gateway_port()
        9123
        >>> del os.environ["AIR_GATEWAY_URL"]
        >>> configured_gateway_port() is None
        True
    """
    from urllib.parse import urlsplit

    from air_sdk.schema.worker_env import WorkerEnv  # the variable ranks report to, too

    url = os.environ.get(WorkerEnv.env_name("gateway_url"))
    if url:
        parts = urlsplit(url)
        if parts.hostname in ("127.0.0.1", "localhost", "::1") and parts.port:
            return parts.port
    return None


def air_home() -> Path:
    """Where an embedded gateway keeps its state: `$AIR_HOME` or `~/.local/share/air`."""
    explicit = os.environ.get("AIR_HOME")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "air"


class ClientSettings(BaseSettings):
    """Where the gateway is and how to authenticate to it."""

    # An empty variable (`AIR_TOKEN=`) means unset: the config file's value stands.
    model_config = SettingsConfigDict(env_prefix="AIR_", extra="ignore", env_ignore_empty=True)

    gateway_url: str = Field(DEFAULT_GATEWAY_URL, description="Base URL of the gateway.")
    token: str | None = Field(None, description="Bearer token for the gateway.")
    timeout_s: float = Field(30.0, gt=0, description="Per-request timeout.")

    @field_validator("gateway_url")
    @classmethod
    def _url_ok(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"gateway_url {v!r} must start with http:// or https://")
        return v.rstrip("/")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, config_file()))


def load_client_settings(**overrides: Any) -> ClientSettings:
    """Settings from init args > env > config file, with a clear error when malformed."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        return ClientSettings(**overrides)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_file()} is not valid TOML: {exc}; fix or delete it") from exc
    except ValueError as exc:
        raise ConfigError(f"bad AIR settings: {exc}") from exc


def token_refused_message(gateway_url: str, token: str | None, explicit: bool) -> str:
    """What every command says when the gateway refuses the token (HTTP 401): where
    the token came from and what to do, the same on every route.

    Example:
        >>> print(token_refused_message("http://127.0.0.1:8470", None, False))  # doctest: +ELLIPSIS
        the gateway at http://127.0.0.1:8470 needs a token and this client has none (no AIR_TOKEN, and none in .../config.toml): if it is another user's gateway, start your own with `air gateway start` (it takes the next free port and writes .../config.toml); if it is yours, set AIR_TOKEN to a token it issued
    """
    config = config_file()
    if not token:
        return (
            f"the gateway at {gateway_url} needs a token and this client has none (no"
            f" AIR_TOKEN, and none in {config}): if it is another user's gateway, start your own with"
            f" `air gateway start` (it takes the next free port and writes {config}); if it"
            " is yours, set AIR_TOKEN to a token it issued"
        )
    if explicit:
        where, fix = "the token given", "give a token this gateway issued"
    elif os.environ.get("AIR_TOKEN"):
        where = "the token in AIR_TOKEN"
        fix = (
            f"set AIR_TOKEN to a token this gateway issued (`air admin token create`),"
            f" or unset it to use the one in {config}"
        )
    else:
        where = f"the token in {config}"
        fix = (
            "`air gateway start` rewrites it for the gateway on this machine; for another,"
            " set AIR_TOKEN to a token it issued (`air admin token create`)"
        )
    return (
        f"the gateway at {gateway_url} does not accept {where} (revoked, or issued by"
        f" another gateway): {fix}"
    )


def write_client_config(gateway_url: str, token: str, path: Path | None = None) -> Path:
    """Write the client config (mode 0600: it holds a token)."""
    path = path or config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'gateway_url = "{gateway_url}"\ntoken = "{token}"\n')
    os.replace(tmp, path)
    return path
