"""`air.output_dir()`: the job's durable output directory (`AIR_OUTPUT_DIR`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from air_sdk.errors import ConfigError

__all__ = ["output_dir"]


def output_dir(
    default: str | os.PathLike[str] = "outputs", *, env: Mapping[str, str] | None = None
) -> Path:
    """The directory where this rank keeps files that should outlive the job (models,
    eval results, plots), created if missing. In an AIR job it is `AIR_OUTPUT_DIR`
    (`air submit --output-dir`, default `<gateway home>/outputs/<job>`), which
    `air outputs JOB` lists and downloads and `air gc` keeps; outside one (a script
    run by hand or by bare torchrun) it is `default`, relative to the working directory.

    Ranks share the directory: write from rank 0 (`air.is_main()`) or under a name
    that holds the rank. A relative path a job writes to lands in its code copy, which
    `air gc` deletes; use this instead (`Trainer(output_dir=str(air.output_dir()))`).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> output_dir(env={"AIR_OUTPUT_DIR": d + "/out"}).is_dir()
        True
    """
    from air_sdk.schema.worker_env import WorkerEnv  # pydantic: loaded when first asked

    name = WorkerEnv.env_name("output_dir")
    raw = (os.environ if env is None else env).get(name, "").strip()
    if "://" in raw:
        raise ConfigError(
            f"{name}={raw} is a URL, not a directory of this machine: write there with"
            f" fsspec (fsspec.open(os.environ['{name}'] + '/model.pt', 'wb'))"
        )
    path = Path(raw) if raw else Path(default)
    path.mkdir(parents=True, exist_ok=True)
    return path
