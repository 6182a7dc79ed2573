"""Reading extra files and directories to add to a bundle (`%%air train --files`,
`@air_sdk.distributed(files=[...])`), keyed by their path in the bundle.

Example:
    >>> collect_files(["data/vocab.txt"], Path.cwd())  # doctest: +SKIP
    {'data/vocab.txt': b'...'}
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from air_sdk.bundle.unpack import _human_bytes
from air_sdk.errors import BundleTooLargeError, SpecError

__all__ = ["MAX_FILES_BYTES", "collect_files"]

#: extra files larger than this in all are refused before they are read
MAX_FILES_BYTES = 512 << 20

_SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".ipynb_checkpoints"})


def collect_files(
    paths: Iterable[str | Path],
    root: Path,
    *,
    max_bytes: int = MAX_FILES_BYTES,
    option: str = "--files",
) -> dict[str, bytes]:
    """Read files and directories to send with a job, keyed by bundle path.

    A path inside `root` keeps its place relative to `root`; one outside lands at the
    bundle's top level under its own name. Directories are read whole, except
    `__pycache__`, `.git` and `.ipynb_checkpoints`. Sizes are checked before reading.
    Messages name the paths as `option` (the flag or argument the user gave them with).

    Raises:
        SpecError: a path does not exist.
        BundleTooLargeError: the files are over `max_bytes` in all.

    Example:
        >>> collect_files(["data", "../shared.bin"], Path("project"))  # doctest: +SKIP
        {'data/vocab.txt': b'a b', 'shared.bin': b'\\x01\\x02'}
    """
    root = Path(root).resolve()
    found: dict[str, Path] = {}
    for raw in paths:
        path = (root / Path(raw).expanduser()).resolve()
        if not path.exists():
            raise SpecError(
                f"{option} {raw}: no such file or directory (relative paths start at {root})"
            )
        base = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
        if path.is_file():
            found[base.as_posix()] = path
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
            for filename in sorted(filenames):
                file = Path(dirpath, filename)
                if file.is_file():
                    found[(base / file.relative_to(path)).as_posix()] = file
    total = sum(file.stat().st_size for file in found.values())
    if total > max_bytes:
        largest = max(found, key=lambda name: found[name].stat().st_size)
        raise BundleTooLargeError(
            f"{option} holds {_human_bytes(total)}; the limit is {_human_bytes(max_bytes)}"
            f" (largest: {largest}): read large data from shared storage inside the job"
        )
    return {name: file.read_bytes() for name, file in found.items()}
