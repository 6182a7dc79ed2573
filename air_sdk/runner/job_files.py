"""A job's files on the gateway host: where they live (`JobPaths`) and its code
directory, built once from its bundle (linked from the shared cache, else unpacked)
or its inline code.

Example:
    >>> paths = JobPaths(Path("/home/air/jobs/train-5d41402a"))
    >>> str(paths.attempt(2))
    '/home/air/jobs/train-5d41402a/attempts/2'
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from air_sdk.runner.node.launch import MODULE_PREFIX
from air_sdk.runner.node.records import exit_records
from air_sdk.runner.nofollow import open_dir, replace_file
from air_sdk.schema import JobSpec

if TYPE_CHECKING:
    from air_sdk.bundle.cache import BundleCache

__all__ = ["INLINE_ENTRYPOINT", "JobPaths", "entrypoint_of", "prepare_code"]

#: the file an inline-code job (`JobSpec.code`) runs, written into its code dir
INLINE_ENTRYPOINT = "__air_main__.py"


@dataclass(frozen=True)
class JobPaths:
    """Where a job's files live on the gateway host; `outputs` is its durable output
    directory (`AIR_OUTPUT_DIR`, `air_sdk.runner.outputs`), kept outside `root` so
    retention never deletes it."""

    root: Path
    outputs: str | None = None

    @property
    def code(self) -> Path:
        return self.root / "code"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def attempt(self, n: int) -> Path:
        return self.root / "attempts" / str(n)

    def exit_records(self, n: int) -> Iterator[tuple[bytes, float]]:
        """(bytes, mtime) of each `rank-*.json` the ranks' supervisors wrote under
        attempt `n`'s `exits/` (`air_sdk.runner.node.records.exit_records`: links, FIFOs
        and devices there skipped, the size capped).

        Example:
            >>> list(JobPaths(Path("/nonexistent")).exit_records(1))
            []
        """
        return exit_records(self.root, f"attempts/{n}/exits")


def prepare_code(
    paths: JobPaths, spec: JobSpec, bundle: Path | None, cache: BundleCache | None
) -> None:
    """Build `paths.code` unless it exists: the bundle's files linked from `cache` (or
    unpacked when there is none), plus the inline code as `INLINE_ENTRYPOINT`, written
    anew each time without following a link the job left in its place."""
    from air_sdk.bundle import unpack_bundle

    code = paths.code
    if not code.exists():
        if bundle is not None:
            assert spec.bundle_sha256 is not None
            if cache is not None:
                cache.materialize(spec.bundle_sha256, bundle, code)
            else:
                unpack_bundle(bundle, code, expected_sha256=spec.bundle_sha256)
        else:
            code.mkdir(parents=True)
    if spec.code is not None:
        # The job's ranks can write its code dir: when the job is placed again, the file
        # may be a link they planted. Replace the name (a fresh file renamed over it)
        # in the dir opened by fd, never write through it (issue 19).
        code_fd = open_dir(paths.root, code.relative_to(paths.root).as_posix())
        try:
            replace_file(code_fd, INLINE_ENTRYPOINT, spec.code.encode())
        finally:
            os.close(code_fd)


def entrypoint_of(spec: JobSpec, paths: JobPaths | None = None) -> str:
    """What the ranks run, relative to the code dir: the inline code's file, `-m MODULE`
    (`runner.node.launch.program_argv` splits it), or the script, which must be in the
    code dir when `paths` is given.

    Example:
        >>> entrypoint_of(JobSpec(module="pkg.train")), entrypoint_of(JobSpec(code="pass"))
        ('-m pkg.train', '__air_main__.py')
    """
    if spec.code is not None:
        return INLINE_ENTRYPOINT
    if spec.module is not None:  # run from the code dir, as `python -m` would
        return MODULE_PREFIX + spec.module
    assert spec.entrypoint is not None
    if paths is not None and not (paths.code / spec.entrypoint).is_file():
        raise FileNotFoundError(f"entrypoint {spec.entrypoint} is not in the bundle")
    return spec.entrypoint
