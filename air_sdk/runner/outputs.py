"""A job's output directory (`AIR_OUTPUT_DIR`): where it is, what it holds, and which
of its files may be served.

Every job has one, as a SageMaker job has `SM_MODEL_DIR` and a Ray Train run its
`storage_path/name`: `JobSpec.output_dir` when the job chose a place, else
`<gateway home>/outputs/<job id>`, or, on a backend with shared storage (Ray's
`AIR_RAY_STORAGE`), `<storage>/jobs/<job id>/outputs`, next to its checkpoints.
It lies outside `<home>/jobs/`, so retention (`air gc`) never deletes it.

The gateway serves only a directory it chose itself (never a job's own
`output_dir`, which could name any of the gateway's files), and only regular files
inside it. The job writes that directory while the gateway reads it, so nothing is
checked by name and then opened by name (a job swapping a file for a link wins that
race): `OutputDir` holds the directory open by fd, walked down from the gateway's own
base with O_NOFOLLOW, and every file is opened relative to it, checked with `fstat`
and served from that fd (`air_sdk.runner.nofollow`).

Example:
    >>> default_output_dir(job_id="j1", home=Path("/home/air"), storage=None)
    '/home/air/outputs/j1'
    >>> default_output_dir(job_id="j1", home=Path("/home/air"), storage="s3://b/air")
    's3://b/air/jobs/j1/outputs'
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from air_sdk.errors import UnsafePathError
from air_sdk.runner.nofollow import iter_files, open_dir, open_file
from air_sdk.schema.outputs import OutputFile

__all__ = ["OUTPUTS_DIR", "OutputDir", "default_output_dir", "list_outputs"]

#: under the gateway's home: one directory per job
OUTPUTS_DIR = "outputs"


def default_output_dir(*, job_id: str, home: Path, storage: str | None) -> str:
    """Where a job that named no `output_dir` keeps its outputs: under the backend's
    shared `storage` when it has one (every node writes there), else under `home`.

    Example:
        >>> default_output_dir(job_id="j1", home=Path("/h"), storage="/mnt/shared")
        '/mnt/shared/jobs/j1/outputs'
    """
    if storage:
        if "://" in storage:
            return storage.rstrip("/") + f"/jobs/{job_id}/outputs"
        return str(PurePosixPath(storage) / "jobs" / job_id / "outputs")
    return str(home / OUTPUTS_DIR / job_id)


class OutputDir:
    """A job's output directory, held open by fd for listing and reading its files.

    `root` must lie under `base` (the gateway's outputs directory or the shared
    storage); each component between them is opened with O_NOFOLLOW, so a directory
    the job swapped for a link is refused with an `UnsafePathError` rather than
    followed. A root that does not exist yet is an empty directory.

    Example:
        >>> import tempfile
        >>> base = Path(tempfile.mkdtemp()); (base / "j1").mkdir()
        >>> _ = (base / "j1" / "x.txt").write_text("hi")
        >>> with OutputDir.open(base / "j1", base) as out:
        ...     [f.path for f in out.files()], out.open_file("x.txt").read()
        (['x.txt'], b'hi')
    """

    def __init__(self, fd: int | None, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def open(cls, root: Path, base: Path) -> OutputDir:
        if not root.is_relative_to(base):
            raise UnsafePathError(f"the output directory {root} is not under {base}")
        relative = root.relative_to(base).as_posix()
        try:
            fd = open_dir(base, relative)
        except FileNotFoundError:
            return cls(None, root)  # the job wrote nothing yet
        except UnsafePathError:
            raise UnsafePathError(
                f"the output directory {root} leads out of {base}: it was replaced by a"
                " link; read it on the nodes"
            ) from None
        return cls(fd, root)

    def files(self) -> list[OutputFile]:
        """The regular files, sorted by path; links are neither listed nor entered."""
        if self._fd is None:
            return []
        found = [
            OutputFile(path=rel, bytes=st.st_size, mtime=st.st_mtime)
            for rel, st in iter_files(self._fd)
        ]
        return sorted(found, key=lambda f: f.path)

    def open_file(self, relative: str) -> BinaryIO:
        """The file `relative` names, open for reading (the caller closes it): an
        `UnsafePathError` saying why for a path that is absolute, climbs with `..`,
        passes through a symlink, or is not a regular file."""
        try:
            if self._fd is None:
                raise FileNotFoundError(relative)
            return os.fdopen(open_file(self._fd, relative), "rb")
        except FileNotFoundError:
            raise UnsafePathError(
                f"{relative!r} is not a file of the job's output directory"
            ) from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_outputs(root: Path) -> list[OutputFile]:
    """The regular files under `root` (none when it does not exist yet), sorted by path;
    symlinks are left out (a served file is never a link).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "a").mkdir(); _ = (d / "a" / "x.txt").write_text("hi")
        >>> [(f.path, f.bytes) for f in list_outputs(d)]
        [('a/x.txt', 2)]
    """
    with OutputDir.open(root, root.parent) as out:
        return out.files()
